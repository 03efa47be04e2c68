"""Varied training prompts for distillation: templates x topics, plus questions about real code snippets
from the Python standard library. Deterministic for a given seed; never yields a held-out prompt
(benchmarks/prompts.jsonl), compared case- and space-insensitively.
"""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = ROOT / "benchmarks" / "prompts.jsonl"

TOPICS = [
    "black holes", "the water cycle", "compound interest", "machine learning", "the immune system",
    "volcanoes", "the stock market", "renewable energy", "the Roman Empire", "vaccines", "plate tectonics",
    "inflation", "the human brain", "climate change", "electric cars", "the internet", "DNA",
    "the Renaissance", "solar panels", "earthquakes", "sleep", "meditation", "coffee", "honey bees",
    "the moon landing", "quantum computing", "blockchain", "recycling", "the Great Wall of China",
    "the printing press", "antibiotics", "rainforests", "coral reefs", "the Industrial Revolution",
    "democracy", "supply and demand", "nutrition", "time management", "public speaking", "gardening",
    "chess", "the Olympic Games", "jazz music", "photography", "budgeting", "learning a new language",
    "job interviews", "remote work", "social media", "cybersecurity", "password managers", "electricity",
    "magnets", "gravity", "the speed of light", "evolution", "dinosaurs", "the ocean tides", "hurricanes",
    "the seasons", "cloud computing", "open source software", "databases", "operating systems",
    "compilers", "encryption", "neural networks", "robotics", "3D printing", "space exploration", "Mars",
    "the periodic table", "chemical reactions", "the heart", "bread baking", "fermentation", "tea",
    "running a marathon", "yoga", "stress", "friendship", "leadership", "teamwork", "negotiation",
    "writing a resume", "starting a small business", "marketing", "customer service", "urban planning",
    "public transport", "bicycles", "airplanes", "trains", "bridges", "skyscrapers", "ancient Egypt",
    "the Vikings", "the Cold War", "world War I", "the Silk Road", "Shakespeare", "poetry", "novels",
    "film making", "video games", "board games", "pets", "dogs", "cats", "birds migration", "whales",
    "forests", "deserts", "mountains", "rivers", "lakes", "glaciers", "the Arctic", "Antarctica",
    "the solar system", "stars", "galaxies", "telescopes", "microscopes", "bacteria", "viruses",
    "the digestive system", "muscles", "bones", "vision", "hearing", "memory", "habits", "motivation",
    "procrastination", "critical thinking", "statistics", "probability", "algebra", "geometry",
    "calculus", "prime numbers", "logic puzzles", "economics", "taxes", "insurance", "mortgages",
    "credit scores", "saving for retirement", "minimalism", "cooking rice", "knife skills", "composting",
]

TOPIC_TEMPLATES = [
    "Explain {t} in simple terms.", "What is {t}?", "Tell me three interesting facts about {t}.",
    "Write a short paragraph about {t}.", "What are the pros and cons of {t}?",
    "How would you explain {t} to a child?", "Give me a brief history of {t}.",
    "What are common misconceptions about {t}?", "Write a haiku about {t}.",
    "Write a short story that involves {t}.", "Why is {t} important?",
    "List five key terms related to {t} and define each.", "What questions should a beginner ask about {t}?",
    "Summarize what everyone should know about {t}.", "Write a limerick about {t}.",
    "How has {t} changed over the last hundred years?", "What is the future of {t}?",
    "Give me a quiz with three questions about {t}.", "Write a tweet about {t}.",
    "Compare {t} and {u}.", "How are {t} and {u} related?", "Write an essay outline about {t}.",
    "What would happen if {t} disappeared?", "Describe {t} in three sentences.",
    "What are the main challenges related to {t}?", "Give me tips for learning about {t}.",
    "Write a dialogue between a teacher and a student about {t}.", "What careers involve {t}?",
    "Explain {t} using an analogy.", "What is the most surprising thing about {t}?",
]

CODE_TASKS = [
    "sorts a list of dictionaries by a given key", "counts the words in a text file",
    "finds the largest number in a list", "checks whether a number is prime",
    "merges two sorted lists into one sorted list", "removes vowels from a string",
    "converts Celsius to Fahrenheit", "flattens a nested list", "computes the average of a list of numbers",
    "finds the most common element in a list", "reverses the words in a sentence",
    "checks whether two strings are anagrams", "returns the greatest common divisor of two numbers",
    "generates all permutations of a string", "parses a date string in ISO format",
    "reads a JSON file and prints its keys", "downloads a web page and counts its links",
    "implements binary search", "implements a stack with push and pop", "implements a queue",
    "computes the median of a list", "capitalizes the first letter of every word",
    "validates an email address with a regular expression", "transposes a matrix",
    "computes the sum of the digits of an integer", "converts a decimal number to binary",
    "checks whether a year is a leap year", "removes duplicate lines from a file",
    "finds all files with a given extension in a directory", "computes the factorial recursively",
    "implements bubble sort", "implements quicksort", "implements merge sort",
    "counts the frequency of each character in a string", "returns the n largest items of a list",
    "splits a list into chunks of size n", "computes the dot product of two vectors",
    "checks whether parentheses in a string are balanced", "converts a string to title case",
    "finds the second smallest number in a list", "rotates a list by k positions",
    "computes a running total of a list", "memoizes a slow function", "times how long a function takes",
    "retries a function call up to three times", "builds a simple command-line argument parser",
    "implements a linked list", "implements a binary tree insert", "computes the Levenshtein distance",
    "groups words by their first letter", "writes a list of rows to a CSV file",
]

LANGS = ["Python", "Python", "Python", "JavaScript", "Java", "C", "C++", "Go", "Rust", "TypeScript", "Ruby"]

CODE_TEMPLATES = [
    "Write a {lang} function that {task}.", "Show me how to write a {lang} program that {task}.",
    "In {lang}, how do I write code that {task}?", "Write {lang} code that {task}, with comments.",
    "Write a {lang} function that {task}, and explain how it works.",
    "Write a unit test for a {lang} function that {task}.",
]

CONCEPTS = [
    "recursion", "a closure", "a decorator", "a generator", "list comprehensions", "exceptions",
    "type hints", "virtual environments", "object-oriented programming", "inheritance", "polymorphism",
    "a REST API", "JSON", "regular expressions", "unit testing", "version control", "a race condition",
    "a deadlock", "big O notation", "a linked list", "a binary search tree", "a heap", "a graph",
    "dynamic programming", "garbage collection", "pointers", "memory leaks", "threads and processes",
    "async and await", "a context manager", "lambda functions", "immutability", "a hash function",
    "SQL joins", "database indexes", "caching", "load balancing", "Docker containers", "environment variables",
    "the difference between == and is in Python", "mutable default arguments in Python",
]

CONCEPT_TEMPLATES = [
    "What is {c}?", "Explain {c} with a short code example.", "When should I use {c}?",
    "What are common mistakes with {c}?", "Explain {c} to a beginner programmer.",
]

SNIPPET_TEMPLATES = [
    "What does this Python code do?\n```python\n{s}\n```",
    "Explain this code line by line:\n```python\n{s}\n```",
    "Add a docstring to this function:\n```python\n{s}\n```",
    "Is there a bug in this code?\n```python\n{s}\n```",
]


# A second pool, appended after the first (so data shards named by prompt index keep their meaning): the
# first ~6000 prompts were all answered in earlier sessions, and the draft is short of teacher answers.
THINGS = [
    "a microwave oven", "a bicycle gear", "a jet engine", "a thermostat", "a vaccine", "a credit card",
    "a search engine", "GPS", "a touchscreen", "a battery", "a solar panel", "a camera lens", "Wi-Fi",
    "a heat pump", "an elevator", "a lock and key", "a compass", "a printer", "noise-cancelling headphones",
    "a washing machine", "a nuclear reactor", "a submarine", "a parachute", "a hot air balloon", "a clock",
    "the stock exchange", "a bank loan", "a hybrid car", "an air conditioner", "a light bulb", "a piano",
    "a water filter", "a smoke detector", "a speedometer", "a barcode scanner", "a 3D printer", "radar",
]
ACTIVITIES = [
    "sleeping better", "saving money on groceries", "learning to cook", "staying motivated at the gym",
    "writing a cover letter", "preparing for an exam", "reducing screen time", "starting a vegetable garden",
    "making new friends in a new city", "planning a road trip", "keeping a houseplant alive",
    "giving a good presentation", "running your first 5k", "organizing a small kitchen",
    "learning to play the guitar", "traveling on a budget", "reading more books", "drinking more water",
    "training a puppy", "keeping a journal", "negotiating a salary", "moving to a new apartment",
    "hosting a dinner party", "studying a foreign language", "taking better photos with a phone",
]
DISHES = [
    "a simple tomato soup", "banana bread", "a chickpea curry", "fried rice", "pancakes", "a Greek salad",
    "guacamole", "a lentil stew", "chocolate chip cookies", "a vegetable stir-fry", "overnight oats",
    "a mushroom risotto", "homemade pizza dough", "a chicken wrap", "hummus", "a fruit smoothie",
]
EVENTS = [
    "World War I", "the fall of the Roman Empire", "the Great Depression", "the American Revolution",
    "the Industrial Revolution", "the collapse of the Soviet Union", "the Protestant Reformation",
    "the Black Death", "the space race", "the invention of the printing press", "the end of the Cold War",
]
EMAILS = [
    "asking a landlord to fix a broken heater", "thanking a colleague for their help on a project",
    "declining a meeting invitation", "asking a professor for an extension", "following up after a job interview",
    "apologizing to a customer for a late delivery", "inviting the team to a farewell lunch",
    "requesting a refund for a damaged product", "introducing yourself to a new team",
    "reminding a client about an unpaid invoice",
]
TOPIC_TEMPLATES_2 = [
    "Explain {t} to a ten-year-old.", "What is the difference between {t} and {u}?",
    "Write a short poem about {t}.", "Give me a summary of {t} in five bullet points.",
    "Describe how {t} affects everyday life.", "What are three tips for someone interested in {t}?",
    "Write a short blog post introduction about {t}.",
]
CHAT_TEMPLATES_2 = [
    "How does {x} work?", "Explain how {x} works in simple terms.", "What are the main parts of {x}?",
]
ACTIVITY_TEMPLATES = [
    "What are three tips for {a}?", "Give me a simple plan for {a}.", "What mistakes do people make when {a}?",
    "Write a short checklist for {a}.",
]
CODE_TASKS_2 = [
    "checks whether a string is a valid IPv4 address", "converts a Roman numeral to an integer",
    "finds the longest word in a sentence", "removes all whitespace from a string",
    "counts how many times a substring occurs", "returns the unique elements of a list in order",
    "computes the power set of a list", "checks whether a list is sorted", "converts a list of pairs to a dictionary",
    "inverts a dictionary", "merges two dictionaries", "finds the intersection of two lists",
    "generates the first n prime numbers", "computes the nth triangular number", "converts hours to minutes and seconds",
    "reads a text file and prints the longest line", "zips two lists into a list of tuples",
    "finds the missing number in a list from 1 to n", "computes compound interest",
    "shuffles a list without using a library", "checks whether a number is a perfect square",
    "converts a string to snake_case", "parses a query string into a dictionary",
    "implements a least recently used cache", "implements depth-first search on a graph",
    "implements breadth-first search on a graph", "finds the shortest path with Dijkstra's algorithm",
    "counts the vowels in a string", "returns the last n lines of a file", "sums all even numbers in a list",
    "calculates the area of a circle", "converts a temperature table from Fahrenheit to Celsius",
    "checks whether a string contains only digits", "pads a number with leading zeros",
    "finds duplicate files by their hash", "prints a multiplication table", "validates a password's strength",
    "computes the cumulative product of a list", "returns the index of the maximum value",
    "splits a string on several delimiters",
]
CONCEPTS_2 = [
    "a dictionary in Python", "a set in Python", "slicing in Python", "the with statement", "f-strings",
    "the map and filter functions", "a lambda expression", "*args and **kwargs", "a class method",
    "a static method", "a property", "an abstract base class", "a dataclass", "the GIL", "a coroutine",
    "an iterator", "a module and a package", "pip", "a shell pipeline", "file permissions in Linux",
    "a foreign key", "a primary key", "an HTTP status code", "a cookie", "CORS", "a hash collision",
    "a stack overflow", "tail recursion", "a callback", "a promise in JavaScript", "a pure function",
    "a merge conflict in git", "a pull request", "continuous integration", "a linter", "a mock object",
]


def _alternate(chat: list[str], code: list[str]) -> list[str]:
    """Chat and code in turn, so that any prefix of the list (what a short run generates) is half code."""
    return [p for pair in zip(chat, code) for p in pair] + chat[len(code):] + code[len(chat):]


def extra_prompts(rng: random.Random) -> list[str]:
    """The second pool: everyday questions and more programming tasks, concepts and stdlib snippets."""
    chat = [tpl.format(x=x) for x in THINGS for tpl in CHAT_TEMPLATES_2]
    chat += [tpl.format(t=t, u=rng.choice([x for x in TOPICS if x != t])) for t in TOPICS for tpl in TOPIC_TEMPLATES_2]
    chat += [tpl.format(a=a) for a in ACTIVITIES for tpl in ACTIVITY_TEMPLATES]
    chat += [f"Give me a recipe for {d}." for d in DISHES] + [f"How do I make {d}?" for d in DISHES]
    chat += [f"Summarize the main causes of {e}." for e in EVENTS] + [f"What were the effects of {e}?" for e in EVENTS]
    chat += [f"Write a polite email {e}." for e in EMAILS] + [f"Write a short, friendly message {e}." for e in EMAILS]
    code = [tpl.format(lang=rng.choice(LANGS), task=task) for task in CODE_TASKS_2 for tpl in CODE_TEMPLATES]
    code += [tpl.format(c=c) for c in CONCEPTS_2 for tpl in CONCEPT_TEMPLATES]
    code += [rng.choice(SNIPPET_TEMPLATES).format(s=s) for s in stdlib_snippets(4000, random.Random(4321))]
    rng.shuffle(chat)
    rng.shuffle(code)
    return _alternate(chat, code)  # training_prompts() drops any prompt of the first pool again


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def held_out_prompts() -> list[str]:
    """The held-out benchmark prompts (never used for training)."""
    if not HELD_OUT.exists():
        return []
    return [json.loads(line)["prompt"] for line in HELD_OUT.read_text().splitlines() if line.strip()]


def stdlib_snippets(limit: int, rng: random.Random) -> list[str]:
    """Short top-level functions (4-20 lines) cut from the Python standard library's source."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))
    rng.shuffle(files)
    out: list[str] = []
    for f in files:
        try:
            lines = f.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        i = 0
        while i < len(lines) and len(out) < limit:
            if lines[i].startswith("def "):
                j = i + 1
                while j < len(lines) and (not lines[j] or lines[j].startswith((" ", "\t"))):
                    j += 1
                body = "\n".join(lines[i:j]).rstrip()
                if 4 <= body.count("\n") + 1 <= 20:
                    out.append(body)
                i = j
            else:
                i += 1
        if len(out) >= limit:
            break
    return out


def training_prompts(seed: int = 1234) -> list[str]:
    """All training prompts, shuffled deterministically, held-out ones excluded."""
    rng = random.Random(seed)
    chat: list[str] = []
    code: list[str] = []
    for t in TOPICS:
        for tpl in TOPIC_TEMPLATES:
            u = rng.choice([x for x in TOPICS if x != t])
            chat.append(tpl.format(t=t, u=u))
    for task in CODE_TASKS:
        for tpl in CODE_TEMPLATES:
            code.append(tpl.format(lang=rng.choice(LANGS), task=task))
    for c in CONCEPTS:
        for tpl in CONCEPT_TEMPLATES:
            code.append(tpl.format(c=c))
    for s in stdlib_snippets(1200, rng):
        code.append(rng.choice(SNIPPET_TEMPLATES).format(s=s))
    banned = {_norm(p) for p in held_out_prompts()}
    rng.shuffle(chat)
    rng.shuffle(code)
    mixed = _alternate(chat, code) + extra_prompts(random.Random(seed + 1))  # half code, like the held-out set
    seen: set[str] = set()
    unique = []
    for p in mixed:
        k = _norm(p)
        if k not in banned and k not in seen:
            seen.add(k)
            unique.append(p)
    return unique


if __name__ == "__main__":
    ps = training_prompts()
    print(len(ps))
    for p in ps[:10]:
        print(repr(p[:120]))
