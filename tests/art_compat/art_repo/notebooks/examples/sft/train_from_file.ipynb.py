%%capture
!uv pip install openpipe-art datasets --prerelease allow --no-cache-dir
# %% [code cell]
import os

WANDB_API_KEY = ""  # required
if WANDB_API_KEY:
    os.environ["WANDB_API_KEY"] = WANDB_API_KEY
# %% [code cell]
import json

from datasets import load_dataset

ds = load_dataset("gretelai/synthetic_text_to_sql", split="train")

with open("train.jsonl", "w") as f:
    for row in ds.select(range(200)):
        messages = [
            {"role": "system", "content": row["sql_context"]},
            {"role": "user", "content": row["sql_prompt"]},
            {"role": "assistant", "content": row["sql"]},
        ]
        f.write(json.dumps({"messages": messages}) + "\n")
# %% [code cell]
import art
from art.serverless.backend import ServerlessBackend
from art.utils.sft import train_sft_from_file

backend = ServerlessBackend()
model = art.TrainableModel(
    name="sft-text-to-sql",
    project="sft-example",
    base_model="Qwen/Qwen3.6-27B",
)
await model.register(backend)

await train_sft_from_file(
    model=model,
    file_path="train.jsonl",
    epochs=3,
    batch_size=2,
    peak_lr=2e-4,
    schedule_type="cosine",
    verbose=True,
)

print("Training complete!")
# %% [code cell]
client = model.openai_client()
completion = await client.chat.completions.create(
    model=model.get_inference_name(),
    messages=[
        {"role": "system", "content": "CREATE TABLE equipment_maintenance (equipment_type VARCHAR(255), maintenance_frequency INT);"},
        {"role": "user", "content": "List all the unique equipment types and their corresponding total maintenance frequency from the equipment_maintenance table."},
    ],
)
print(completion.choices[0].message.content)