"""The questions: short factual questions a small chat model knows, each answerable in one word.

Pure data (no I/O, no LLM). Only the form of the reply is graded (`env.reward_of`), so the answers are
not kept: the env trains a format, and a question need only invite a one-word answer that the model
would otherwise wrap in a sentence."""

from __future__ import annotations

QUESTIONS: tuple[str, ...] = (
    "What color is the sky on a clear day?", "What animal says meow?", "What is the opposite of hot?",
    "What do bees make?", "Which planet do we live on?", "What is frozen water called?",
    "What fruit keeps the doctor away?", "What is the capital of France?", "What do you call a baby dog?",
    "What season comes after winter?", "Which metal is yellow and precious?", "What gas do plants breathe in?",
    "What is the largest ocean?", "What instrument has 88 keys?", "What do you sleep on?",
    "What shape has three sides?", "Which organ pumps blood?", "What is the color of grass?",
    "What do birds use to fly?", "What is the opposite of up?", "What animal barks?",
    "What color are bananas?", "What falls from clouds when it rains?", "What do you write with?",
    "What is the star at the center of our solar system?", "Which month comes after May?",
    "What do fish live in?", "What is the capital of Japan?", "What do cows produce that people drink?",
    "What is the opposite of day?", "Which animal is known as the king of the jungle?",
    "What do you use to cut paper?", "What is the largest planet in our solar system?",
    "What color is snow?", "What do caterpillars turn into?", "Which bird is a symbol of peace?",
    "What is the capital of Italy?", "What do you call a baby cat?", "How many legs does a spider have?",
    "What is the opposite of big?", "Which season is the coldest?", "What do you drink when you are thirsty?",
    "What is the capital of Germany?", "Which animal has a trunk?", "What color is a ripe tomato?",
    "What do you call the meal eaten in the morning?", "Which day comes after Monday?",
    "What is the opposite of wet?", "What do spiders spin?", "Which planet is called the red planet?",
    "What do you wear on your feet?", "What is the capital of Spain?", "Which animal gives us wool?",
    "What is the opposite of fast?", "What color do you get by mixing blue and yellow?",
    "What do you call a young frog?", "Which body part do you use to smell?", "What is the capital of Egypt?",
    "What is the hardest natural substance?", "Which animal is famous for its black and white stripes?",
    "What do you call frozen rain?", "What is the opposite of left?", "Which organ do you think with?",
    "What do hens lay?", "What is the capital of Russia?", "Which month has the fewest days?",
    "What do you call a house made of snow?", "What is the opposite of open?",
    "Which animal is the tallest?", "What do you use to unlock a door?", "What color is coal?",
    "What is the capital of Canada?", "Which insect glows at night?", "What do you call a baby cow?",
    "What is the opposite of happy?", "Which planet has famous rings?", "What is the main ingredient of bread?",
    "What do you call the hottest season?", "Which animal hops and carries its baby in a pouch?",
    "What is the capital of China?", "What do you call a group of wolves?", "What is the opposite of full?",
    "Which sense do your ears give you?", "What do you call a person who flies a plane?",
    "What is the capital of Greece?", "Which sweet food do bees store in hives?", "What is the opposite of old?",
    "What do you call water falling as white flakes?", "Which animal is the largest mammal?",
    "What is the color of the sun in drawings?", "What do you call a doctor for animals?",
    "What is the capital of Portugal?", "Which vegetable do rabbits love?", "What is the opposite of dark?",
    "What do you use to see?", "Which number comes after nine?", "What is the capital of Ireland?",
    "What is the opposite of heavy?", "Which tree produces acorns?", "What do you call the place where books are lent?",
    "What is the capital of Norway?", "Which animal is known for its slow pace and shell?",
    "What do you call a baby sheep?", "What is the opposite of early?", "Which gas do humans need to breathe?",
    "What do you call the person who teaches a class?", "What is the capital of Austria?",
    "Which fruit is long, curved and yellow?", "What is the opposite of loud?", "What do you call a baby horse?",
    "Which continent is Egypt in?", "What is the capital of Sweden?", "What is the opposite of strong?",
    "Which animal builds dams?", "What do you call the tool for hitting nails?", "What is the capital of Poland?",
    "Which drink is made from roasted beans?", "What is the opposite of sweet?", "What do you call a baby bear?",
    "Which planet is closest to the sun?", "What is the capital of Kenya?", "What is the opposite of inside?",
)

N_VAL = 32
N_TEST = 32
