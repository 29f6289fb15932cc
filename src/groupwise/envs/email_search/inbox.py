"""A deterministic synthetic mailbox corpus (ART-E-like), stored in SQLite with an FTS5 index.

`generate_corpus(seed)` is a pure function: several inboxes, each with its owner, ~40 contacts and
hundreds of emails over one year: chatty filler, threads of replies, and "fact" emails that carry one
retrievable answer each (a flight confirmation code, a project budget, a meeting room, an invoice number,
a new phone number, a team-dinner restaurant). Each fact becomes one question (questions.py).

Why synthetic: these machines reach no dataset hub, and generated facts come with exact ground truth
and source ids. The generator keeps each fact findable: within an inbox each (fact type, entity) pair
is used once, and filler text never uses the words a fact is searched by ("flight", "budget",
"review", "invoice", "phone", "dinner", city, vendor and team names). The tests check that searching
with each question's keywords returns its source email.

`build_database(path, corpus)` writes the table ``emails`` and its FTS5 index ``emails_fts``
(subject + body). `default_database()` builds it once into a cache folder and reuses it.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import sqlite3
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from groupwise.errors import ConfigError, EnvError

GENERATOR_VERSION = 1  # bump when the generator changes, so cached databases are rebuilt

FIRST = ("Maria", "James", "Aisha", "Tomas", "Yuki", "Priya", "Lukas", "Sofia", "Omar", "Elena", "Noah", "Mei",
         "Carlos", "Hannah", "Kwame", "Ingrid", "Ravi", "Chloe", "Mateo", "Zara", "Felix", "Amara", "Jonas",
         "Leila", "Diego", "Nina", "Samuel", "Freya", "Hiro", "Rosa", "Viktor", "Alma", "Tariq", "Clara",
         "Bruno", "Selin", "Oscar", "Lena", "Arjun", "Maya")
LAST = ("Lopez", "Okafor", "Schmidt", "Tanaka", "Haddad", "Novak", "Moreau", "Rossi", "Larsen", "Kowalski",
        "Mensah", "Ibarra", "Petrov", "Walsh", "Nakamura", "Dubois", "Silva", "Fischer", "Kaur", "Jensen",
        "Abbott", "Romero", "Varga", "Lindqvist", "Osei", "Castillo", "Brennan", "Yilmaz", "Horvat", "Quinn",
        "Sato", "Delgado", "Engel", "Farrow", "Gallo", "Holm", "Iqbal", "Kerr", "Marsh", "Ng")
COMPANIES = ("northwind", "bluepeak", "ardent", "copperleaf", "halcyon", "meridian", "stonebridge", "tidewater")
EXTERNAL = ("gmail.example", "outlook.example", "fastmail.example", "proton.example")
PROJECTS = ("Falcon", "Juniper", "Cobalt", "Aurora", "Tundra", "Mosaic", "Beacon", "Quartz", "Saffron", "Nimbus",
            "Harbor", "Obsidian", "Pioneer", "Lantern", "Meteor", "Willow", "Granite", "Zephyr", "Orchid", "Vector")
CITIES = ("Denver", "Lisbon", "Osaka", "Nairobi", "Toronto", "Munich", "Seattle", "Madrid", "Dublin", "Austin",
          "Oslo", "Santiago", "Melbourne", "Prague", "Boston", "Singapore", "Vienna", "Chicago", "Montreal",
          "Helsinki")
VENDORS = ("Brightline Supplies", "Kestrel Logistics", "Ironwood Printing", "Summit Catering", "Polaris Telecom",
           "Redfern Furniture", "Clearwave Cleaning", "Foxglove Design", "Tallis Security", "Marigold Travel",
           "Sterling Couriers", "Evergreen Landscaping")
RESTAURANTS = ("The Copper Pot", "Luna Trattoria", "Saffron House", "Blue Fig", "Harbor Grill", "Casa Verde",
               "The Olive Branch", "Kumo Sushi", "Little Lisbon", "The Brass Lantern", "Pho Real", "Maple & Rye")
TEAMS = ("analytics", "payments", "onboarding", "security", "mobile", "research", "logistics", "marketing")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
TIMES = ("9:00", "9:30", "10:00", "11:00", "13:30", "14:00", "15:00", "16:30")
FACT_KINDS = ("flight", "budget", "room", "invoice", "phone", "dinner")

# Filler: (subject, body). Their words avoid every fact keyword (see the module docstring).
FILLER = (
    ("Weekly update", "Hi {to},\n\nQuick weekly update: {project} is on track and the next milestone is {weekday}. "
     "Let me know if anything blocks you.\n\n{sig}"),
    ("Lunch on {weekday}?", "Hey {to},\n\nAre you free for lunch on {weekday}? There is a new place near the office.\n\n{sig}"),
    ("Re: notes from the sync", "Thanks {to}, I added my notes to the shared doc. Two open questions remain on {project}.\n\n{sig}"),
    ("Reminder: timesheets", "Hi all,\n\nPlease submit your timesheets before {weekday} noon.\n\n{sig}"),
    ("Office closed on {weekday}", "Hello,\n\nThe office will be closed on {weekday} for maintenance work. Remote work is fine.\n\n{sig}"),
    ("Quick question about {project}", "Hi {to},\n\nDo you know who owns the data export for {project}? I could not find it in the wiki.\n\n{sig}"),
    ("Slides for {weekday}", "Hi {to},\n\nAttached are the slides for {weekday}. Comments welcome.\n\n{sig}"),
    ("Survey: workplace feedback", "Hi everyone,\n\nPlease fill in the short feedback survey by {weekday}. It takes five minutes.\n\n{sig}"),
    ("Parking garage", "Hi all,\n\nThe parking garage will be repainted on {weekday}; please use the street spots.\n\n{sig}"),
    ("{project} planning doc", "Hi {to},\n\nI started a planning doc for {project}. Can you add the open risks?\n\n{sig}"),
    ("Holiday schedule", "Hi team,\n\nThe holiday schedule is now on the intranet. Book your days off early.\n\n{sig}"),
    ("Coffee chat", "Hi {to},\n\nWant to grab a coffee on {weekday} afternoon and catch up?\n\n{sig}"),
    ("Laptop upgrade", "Hi {to},\n\nIT will swap your laptop on {weekday}. Back up anything local first.\n\n{sig}"),
    ("Book club", "Hello friends,\n\nThis month we read a novel about a lighthouse keeper. We meet {weekday} evening.\n\n{sig}"),
    ("Training session", "Hi {to},\n\nThere is an internal training on writing clear docs on {weekday}. Want to join?\n\n{sig}"),
)
REPLIES = ("Thanks, noted.", "Got it, thank you!", "Sounds good to me.", "Thanks for letting me know.",
           "Perfect, see you then.", "Appreciated, I will pass it on.")


@dataclass(frozen=True)
class Email:
    message_id: str
    inbox: str  # the owner's address
    thread_id: str
    subject: str
    from_addr: str
    to_addrs: str  # comma separated
    date: str  # "YYYY-MM-DD HH:MM:SS"
    body: str


@dataclass(frozen=True)
class Fact:
    """One retrievable answer, and the question that asks for it (see questions.py)."""

    kind: str
    inbox: str
    source_id: str
    question: str
    answer: str
    keywords: tuple[str, ...]
    date: str


@dataclass
class Corpus:
    inboxes: list[str]
    emails: list[Email] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)


def _address(first: str, last: str, domain: str) -> str:
    return f"{first.lower()}.{last.lower()}@{domain}"


def _signature(first: str, last: str) -> str:
    return f"Best,\n{first} {last}"


def _timestamp(rng: random.Random, year: int) -> dt.datetime:
    day = dt.date(year, 1, 1) + dt.timedelta(days=rng.randrange(365))
    return dt.datetime(day.year, day.month, day.day, rng.randint(7, 19), rng.randrange(60), rng.randrange(60))


def _fact_email(kind: str, rng: random.Random, owner: tuple[str, str], contact: tuple[str, str, str],
                entity: str) -> tuple[str, str, str, str, tuple[str, ...]]:
    """(subject, body, question, answer, keywords) of one fact email about `entity`."""
    of, _ = owner
    cf, cl, _ = contact
    sig = _signature(cf, cl)
    if kind == "flight":
        code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
        day = f"{rng.choice(WEEKDAYS)} {rng.randint(1, 28)} {rng.choice(('March', 'May', 'August', 'October'))}"
        return (f"Flight confirmation: {entity}",
                f"Hi {of},\n\nYour flight to {entity} on {day} is booked. The confirmation code is {code}. "
                f"Please check in online 24 hours before departure.\n\n{sig}",
                f"What is the confirmation code for my flight to {entity}?", code, ("flight", entity))
    if kind == "budget":
        amount = rng.randrange(20, 500) * 1000
        return (f"{entity} budget approved",
                f"Hi {of},\n\nGood news: finance approved the budget for project {entity}. The approved budget is "
                f"${amount:,}. Please keep spending within it.\n\n{sig}",
                f"What is the approved budget for project {entity}?", f"${amount:,}", (entity, "budget"))
    if kind == "room":
        room = f"{rng.randint(1, 9)}{rng.choice('ABCDEF')}"
        return (f"{entity} design review moved",
                f"Hi {of},\n\nThe {entity} design review is moving to {rng.choice(WEEKDAYS)} at {rng.choice(TIMES)} "
                f"in room {room}. Same agenda as before.\n\n{sig}",
                f"Which room is the {entity} design review in?", room, (entity, "review"))
    if kind == "invoice":
        number = f"INV-{rng.randrange(10000, 99999)}"
        return (f"Invoice {number} from {entity}",
                f"Dear {of},\n\nPlease find attached invoice {number} from {entity} for ${rng.randrange(300, 9000):,}, "
                f"payable within 30 days.\n\nKind regards,\n{entity}",
                f"What is the number of the invoice from {entity}?", number, (entity.split()[0], "invoice"))
    if kind == "phone":
        phone = f"555-{rng.randrange(1000, 9999)}"
        return ("My new number",
                f"Hi {of},\n\nI switched carriers, so my new phone number is {phone}. The old one stops working "
                f"next week.\n\n{sig}",
                f"What is {cf} {cl}'s new phone number?", phone, (cl, "phone"))
    if kind == "dinner":
        place = rng.choice(RESTAURANTS)
        return (f"{entity.capitalize()} team dinner",
                f"Hi {of},\n\nI booked {place} for the {entity} team dinner on {rng.choice(WEEKDAYS)} at 19:00. "
                f"Let me know about dietary needs.\n\n{sig}",
                f"Which restaurant is booked for the {entity} team dinner?", place, (entity, "dinner"))
    raise ConfigError(f"unknown fact kind {kind!r}", what="inbox fact")


def _generate_inbox(seed: int, index: int, emails_per_inbox: int, facts_per_kind: int, year: int) -> tuple[list[Email], list[Fact]]:
    rng = random.Random(f"inbox:{seed}:{index}")
    company = COMPANIES[index % len(COMPANIES)] + ".example"
    owner = (rng.choice(FIRST), rng.choice(LAST))
    owner_addr = _address(*owner, company)
    contacts: list[tuple[str, str, str]] = []
    seen = {owner}
    while len(contacts) < 40:
        first, last = rng.choice(FIRST), rng.choice(LAST)
        if (first, last) in seen or any(c[1] == last for c in contacts):
            continue  # unique last names, so a phone question's keywords name one person
        seen.add((first, last))
        domain = company if rng.random() < 0.7 else rng.choice(EXTERNAL)
        contacts.append((first, last, _address(first, last, domain)))
    emails: list[Email] = []
    facts: list[Fact] = []
    used_ids: set[str] = set()

    def add(subject: str, body: str, sender: str, to: str, when: dt.datetime, thread: str | None = None) -> Email:
        # Random ids, not a counter: fact emails are generated first and must not be findable by id order.
        mid = f"m{index}-{rng.getrandbits(24):06x}"
        while mid in used_ids:
            mid = f"m{index}-{rng.getrandbits(24):06x}"
        used_ids.add(mid)
        email = Email(mid, owner_addr, thread or mid, subject, sender, to, when.strftime("%Y-%m-%d %H:%M:%S"), body)
        emails.append(email)
        return email

    def replies(first: Email, first_when: dt.datetime, other: tuple[str, str, str], n: int) -> None:
        when = first_when
        for k in range(n):
            when = when + dt.timedelta(hours=rng.randint(1, 30))
            from_owner = (k % 2 == 0) == (first.from_addr != owner_addr)
            sender, to = (owner_addr, other[2]) if from_owner else (other[2], owner_addr)
            name = owner if from_owner else other[:2]
            subject = first.subject if first.subject.startswith("Re: ") else f"Re: {first.subject}"
            add(subject, f"{rng.choice(REPLIES)}\n\n{_signature(*name)}", sender, to, when, thread=first.thread_id)

    entities = {
        "flight": rng.sample(CITIES, facts_per_kind),
        "budget": rng.sample(PROJECTS, facts_per_kind),
        "room": rng.sample(PROJECTS, facts_per_kind),
        "invoice": rng.sample(VENDORS, facts_per_kind),
        "phone": [c[1] for c in rng.sample(contacts, facts_per_kind)],
        "dinner": rng.sample(TEAMS, facts_per_kind),
    }
    by_last = {c[1]: c for c in contacts}
    for kind in FACT_KINDS:
        for entity in entities[kind]:
            contact = by_last[entity] if kind == "phone" else rng.choice(contacts)
            subject, body, question, answer, keywords = _fact_email(kind, rng, owner, contact, entity)
            sender = f"billing@{entity.split()[0].lower()}.example" if kind == "invoice" else contact[2]
            when = _timestamp(rng, year)
            email = add(subject, body, sender, owner_addr, when)
            facts.append(Fact(kind, owner_addr, email.message_id, question, answer, keywords, email.date))
            replies(email, when, contact, rng.choice((0, 0, 1, 2)))
    while len(emails) < emails_per_inbox:
        contact = rng.choice(contacts)
        subject, body = rng.choice(FILLER)
        fill = {"to": owner[0], "project": rng.choice(PROJECTS), "weekday": rng.choice(WEEKDAYS)}
        outgoing = rng.random() < 0.25
        if outgoing:
            fill["to"] = contact[0]
        fill["sig"] = _signature(*(owner if outgoing else contact[:2]))
        sender, to = (owner_addr, contact[2]) if outgoing else (contact[2], owner_addr)
        when = _timestamp(rng, year)
        email = add(subject.format(**fill), body.format(**fill), sender, to, when)
        if rng.random() < 0.3:
            replies(email, when, contact, rng.randint(1, 3))
    return emails[:emails_per_inbox] if len(emails) > emails_per_inbox else emails, facts


@lru_cache(maxsize=4)
def generate_corpus(seed: int = 0, n_inboxes: int = 8, emails_per_inbox: int = 800, facts_per_kind: int = 5,
                    year: int = 2024) -> Corpus:
    """The whole corpus, a pure function of its arguments (cached: treat the result as read-only)."""
    if not 1 <= n_inboxes <= len(COMPANIES) * 4:
        raise ConfigError(f"n_inboxes={n_inboxes} must be in 1..{len(COMPANIES) * 4}", what="inbox arguments")
    if not 1 <= facts_per_kind <= len(VENDORS):
        raise ConfigError(f"facts_per_kind={facts_per_kind} must be in 1..{len(VENDORS)}", what="inbox arguments")
    corpus = Corpus(inboxes=[])
    for i in range(n_inboxes):
        emails, facts = _generate_inbox(seed, i, emails_per_inbox, facts_per_kind, year)
        corpus.inboxes.append(emails[0].inbox)
        corpus.emails.extend(emails)
        corpus.facts.extend(facts)
    return corpus


SCHEMA = """
CREATE TABLE emails (
    id INTEGER PRIMARY KEY,
    message_id TEXT UNIQUE NOT NULL,
    inbox TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    from_addr TEXT NOT NULL,
    to_addrs TEXT NOT NULL,
    date TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX emails_inbox_date ON emails(inbox, date);
CREATE VIRTUAL TABLE emails_fts USING fts5(subject, body, content='emails', content_rowid='id');
"""


def check_fts5() -> None:
    """Raise a clear error when this Python's SQLite lacks FTS5 (the search tool needs it)."""
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError as exc:
        raise EnvError(
            f"this Python's SQLite ({sqlite3.sqlite_version}) has no FTS5 ({exc}); the email environment "
            "needs it. Use a Python built with a recent SQLite (python.org and conda builds have FTS5)."
        ) from exc


def build_database(path: str | os.PathLike, corpus: Corpus) -> Path:
    """Write the corpus to a SQLite file with an FTS5 index (atomically: temp file, then rename)."""
    check_fts5()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        con = sqlite3.connect(tmp)
        with con:
            con.executescript(SCHEMA)
            con.executemany(
                "INSERT INTO emails (message_id, inbox, thread_id, subject, from_addr, to_addrs, date, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(e.message_id, e.inbox, e.thread_id, e.subject, e.from_addr, e.to_addrs, e.date, e.body)
                 for e in corpus.emails],
            )
            con.execute("INSERT INTO emails_fts(emails_fts) VALUES ('rebuild')")
        con.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def cache_dir() -> Path:
    """Where generated data lives: $GROUPWISE_CACHE, else ~/.cache/groupwise (never inside the repo)."""
    return Path(os.environ.get("GROUPWISE_CACHE") or Path.home() / ".cache" / "groupwise")


def default_database(seed: int = 0) -> Path:
    """The default corpus's database, built on first use (a second or so) and reused after."""
    path = cache_dir() / "email_search" / f"inbox-v{GENERATOR_VERSION}-s{seed}.sqlite"
    if not path.exists():
        build_database(path, generate_corpus(seed))
    return path
