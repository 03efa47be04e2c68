"""Varied training prompts for distillation: templates x topics, plus questions about real code snippets
from the Python standard library. Deterministic for a given seed; never yields a held-out prompt
(runner/bench/prompts.jsonl), compared case- and space-insensitively.
"""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = ROOT / "runner" / "bench" / "prompts.jsonl"

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

# A third pool, appended after the second (so data shards named by prompt index keep their meaning): all
# 8421 prompts of the first two pools have been answered. New subjects only; none of the held-out subjects.
SUBJECTS_3 = [
    "the Byzantine Empire", "the Aztecs", "the Ottoman Empire", "the Maya civilization", "the Mongol Empire",
    "origami", "the placebo effect", "circadian rhythms", "the Doppler effect", "sound waves", "tsunamis",
    "wind turbines", "nuclear fusion", "antimatter", "dark matter", "exoplanets", "comets",
    "the International Space Station", "satellites", "octopuses", "ants", "mushrooms", "wolves", "elephants",
    "sharks", "penguins", "tardigrades", "allergies", "the gut microbiome", "blood types", "caffeine", "dreams",
    "sign language", "writing systems", "calligraphy", "the history of money", "cryptocurrency",
    "universal basic income", "the minimum wage", "trade tariffs", "game theory", "behavioral economics",
    "opportunity cost", "index funds", "beekeeping", "knitting", "pottery", "woodworking", "rock climbing",
    "sailing", "stand-up comedy", "opera", "hip-hop", "classical music", "the blues", "Gothic architecture",
    "impressionism", "the Bauhaus", "street art", "typography", "color theory", "animation", "podcasts",
    "journalism", "public libraries", "museums", "the metric system", "time zones", "calendars",
    "maps and cartography", "lighthouses", "canals", "dams", "high-speed rail", "container shipping",
    "supply chains", "vertical farming", "desalination", "wetlands", "mangroves", "caves", "geysers",
    "fossils", "diamonds", "steel", "concrete", "plastics", "paper making", "the Paralympics",
    "the FIFA World Cup", "the scientific method", "peer review", "Stoicism", "self-driving cars", "drones",
    "virtual reality", "smart homes", "5G networks", "semiconductors", "transistors",
]
SUBJECT_TEMPLATES_3 = [
    "Why should I care about {t}? Give me a short overview.", "Give me a one-paragraph overview of {t}.",
    "What are some fun facts about {t} that most people don't know?",
    "How would you explain {t} to a curious teenager?", "Write a short quiz with answers about {t}.",
    "What should I learn first if I want to understand {t}?", "Write a four-line rhyming poem about {t}.",
]
THINGS_3 = [
    "a dishwasher", "an induction stove", "a pressure cooker", "a vending machine", "a traffic light",
    "an escalator", "a zipper", "a ballpoint pen", "a toaster", "an electric kettle", "a vacuum cleaner",
    "a smartwatch", "a QR code", "contactless payment", "an electric toothbrush", "a sewing machine",
    "a hydroelectric dam", "a car engine", "a car's transmission", "an airbag", "anti-lock brakes",
    "a pulley", "a mechanical watch", "a fuel cell", "an MRI machine", "an X-ray machine", "a pacemaker",
    "a hearing aid", "a seismograph", "a barometer", "a metal detector", "a fire extinguisher",
    "a microphone", "a loudspeaker", "an FM radio", "an e-reader", "a USB stick", "a hard drive",
    "a solid-state drive", "a home router", "a VPN", "an email spam filter", "a canal lock",
    "a suspension bridge", "a lawn mower",
]
THING_TEMPLATES_3 = [
    "How does {x} work?", "Explain the basic principle behind {x}.",
    "What are the main components of {x}, and what does each one do?",
    "Who invented {x}, and how has it changed since?",
]
ACTIVITIES_3 = [
    "learning to swim as an adult", "decluttering a closet", "meal prepping for the week",
    "preparing for a long flight", "learning to touch type", "starting a podcast", "writing a first novel",
    "learning to draw", "caring for a sourdough starter", "painting a room", "assembling flat-pack furniture",
    "growing herbs on a windowsill", "preparing for a driving test", "buying a used car", "planning a wedding",
    "throwing a kid's birthday party", "volunteering at a local charity", "learning to knit",
    "adopting a rescue cat", "introducing a new cat to a dog", "teaching a child to ride a bike",
    "learning to code as an adult", "switching careers", "preparing for the first day at a new job",
    "running an effective meeting", "writing a eulogy", "giving a wedding toast", "learning to juggle",
    "cleaning a cast iron pan", "changing a flat tire", "jump-starting a car", "unclogging a drain",
    "fixing a leaky faucet", "setting up a home network", "backing up family photos",
    "sticking to a morning routine", "improving your handwriting", "memorizing a speech",
    "learning to sing", "dealing with jet lag", "selling things online", "studying for a math test",
]
ACTIVITY_TEMPLATES_3 = [
    "Any advice for {a}?", "What are the most important things to know about {a}?",
    "Give me step-by-step instructions for {a}.", "What mistakes should I avoid when {a}?",
]
DISHES_3 = [
    "shakshuka", "a beef stew", "French toast", "a Thai green curry", "fish tacos", "a shepherd's pie",
    "a quiche", "apple crumble", "carrot cake", "a black bean soup", "roast chicken with vegetables",
    "falafel", "a Caesar salad", "dumplings", "a frittata", "brownies", "scones", "miso soup", "paella",
    "chili con carne", "baked salmon", "naan bread", "a lemon tart", "tzatziki", "a butternut squash soup",
    "stuffed peppers", "a fluffy omelette", "homemade granola", "hot chocolate from scratch", "fried eggplant",
]
DISH_TEMPLATES_3 = [
    "Give me a recipe for {d}.", "What's the easiest way to make {d} at home?",
    "What are some tips for making {d} taste better?",
]
EVENTS_3 = [
    "the Norman Conquest of England", "the Meiji Restoration", "the Haitian Revolution", "the Russian Revolution",
    "the fall of Constantinople", "the signing of the Magna Carta", "the partition of India",
    "the Spanish Civil War", "the Irish Potato Famine", "the California Gold Rush", "the Thirty Years' War",
    "the American Civil War", "the Crusades", "the Mongol conquests", "the unification of Germany",
    "the Cuban Missile Crisis", "the fall of the Berlin Wall", "the Apollo 13 mission", "the Dust Bowl",
    "the Chernobyl disaster", "the Congress of Vienna", "the Opium Wars", "the Glorious Revolution",
    "the voyages of Zheng He", "the building of the Transcontinental Railroad", "the Scientific Revolution",
    "the Enlightenment", "the Age of Exploration", "the Hundred Years' War", "the Wars of the Roses",
]
EVENT_TEMPLATES_3 = [
    "What led to {e}?", "Why was {e} historically significant?", "Give me a short timeline of {e}.",
]
MESSAGES_3 = [
    "asking a neighbor to keep the noise down at night", "congratulating a friend on a new job",
    "cancelling a gym membership", "asking a former professor for a letter of recommendation",
    "welcoming a new member to a book club", "rescheduling a doctor's appointment",
    "telling a client that a project will be a week late", "thanking a teacher at the end of the school year",
    "asking about an apartment listing", "complaining to an airline about lost luggage",
    "asking a contractor for a quote", "resigning from a job on good terms",
    "checking in with a friend who has been quiet lately", "inviting neighbors to a block party",
    "following up on an email that got no reply", "asking for feedback on a presentation",
    "turning down a job offer politely", "requesting a meeting with a school principal",
    "asking a landlord about renewing a lease", "apologizing for missing a friend's birthday",
    "negotiating a lower price with a supplier", "confirming the details of a catering order",
    "asking a senior colleague to be a mentor", "reporting a bug to a software vendor",
    "reaching out to an old friend after many years",
]
MESSAGE_TEMPLATES_3 = [
    "Write an email {m}.", "Draft a short text message {m}.", "Help me write a professional but warm note {m}.",
]
EVERYDAY_QUESTIONS_3 = [
    "Why do onions make you cry?", "Why does bread go stale?", "Why do cats purr?", "Why do we yawn?",
    "Why is the ocean salty?", "How do airplanes stay in the air?", "Why do we get goosebumps?",
    "How does soap kill germs?", "Why does ice float?", "Why do our fingers wrinkle in water?",
    "How do fireflies glow?", "Why do we have leap years?", "Why does popcorn pop?",
    "How do chameleons change color?", "Why do some people snore?",
    "Why does metal feel colder than wood at the same temperature?", "Why do we hiccup?",
    "Why do cut apples turn brown?", "Why does my voice sound different on recordings?",
    "Why do mosquitoes bite some people more than others?", "Why do dogs wag their tails?",
    "How do glow sticks work?", "Why is it harder to breathe at high altitude?",
    "Why does salt melt ice on roads?", "Why do some foods taste spicy?", "Why does coffee keep you awake?",
    "How do bees make honey?", "Why do we have fingerprints?", "Why do knuckles crack?",
    "Why do my ears pop on airplanes?", "Why are flamingos pink?", "How do spiders make silk?",
    "Why do zebras have stripes?", "How do bats find their way in the dark?", "Why is yawning contagious?",
    "How do antacids work?", "Why does hair turn gray?", "Why do we get brain freeze?",
    "How does sunscreen work?", "Why does the moon look bigger near the horizon?", "How do hot springs form?",
    "Why do some people get motion sickness?", "How do pearls form?", "Why do cats usually land on their feet?",
    "How does a thermos keep drinks hot?", "Why does a balloon stick to the wall after you rub it on your hair?",
    "How do salmon find their way back to the river where they were born?", "Why do old books smell the way they do?",
    "How does yeast make dough rise?", "Why does fresh pineapple make your mouth tingle?", "Why do we blink?",
    "How do I get a coffee stain out of a white shirt?", "How do I remove a stripped screw?",
    "How often should I water a cactus?", "How can I tell if an egg is still fresh?", "How do I fold a fitted sheet?",
    "How do I hang a picture so that it's straight?", "How can I make my phone battery last longer?",
    "How do I get rid of fruit flies in the kitchen?", "How do I tie a tie?",
    "How can I stop my glasses from fogging up when I wear a mask?", "How do I remove rust from a bike chain?",
    "Why do we get hangry when we skip a meal?", "Why do babies sleep so much?",
    "Why does time seem to go faster as we get older?", "How do magicians make a coin disappear?",
    "Why do people like scary movies?", "How do crossword puzzle makers build a puzzle?",
]
SITUATIONS_3 = [
    "nervous about a job interview tomorrow", "struggling to make friends at university",
    "feeling overwhelmed by a big project", "trying to decide between two job offers",
    "having trouble waking up early", "about to move abroad for the first time", "arguing a lot with my roommate",
    "falling behind on an online course", "bored with my current hobbies", "trying to cut back on sugar",
    "spending too much money on takeout", "giving a talk next week and I'm terrified",
    "feeling burned out after a busy year", "starting a new job next Monday",
    "planning to adopt a dog but I live in a small apartment", "unsure how to tell a friend I can't lend them money",
    "getting distracted by too many phone notifications", "trying to learn to code in my spare time",
    "a new parent running on very little sleep", "thinking about going back to school at 35",
    "preparing to ask for a raise", "trying to keep in touch with family who live far away",
    "struggling to keep my apartment tidy", "finding it hard to say no to extra tasks",
    "about to run my first team meeting", "trying to read more but I never find the time",
    "feeling lonely after moving to a new town", "saving up for my first car", "learning to cook for one person",
    "trying to choose a college major",
]
SITUATION_TEMPLATES_3 = [
    "I'm {s}. What should I do?", "I'm {s}. Can you give me some practical advice?",
    "I'm {s}. What are a few small steps I could take this week?",
]
STORY_SUBJECTS_3 = [
    "a lighthouse keeper who finds a message in a bottle", "a robot learning to paint",
    "the last bookstore in a busy city", "a cat who thinks it runs the house", "a grandmother's secret recipe",
    "a train that never stops", "a dragon who is afraid of the dark", "two strangers sharing an umbrella",
    "a village where the sun never sets", "a lost glove looking for its pair", "an astronaut's first night on Mars",
    "a city after everyone has gone to sleep", "a kid who finds an old map in the attic",
    "an old clock that starts running backward", "a musician playing in an empty subway station",
    "a friendship between a whale and a seagull", "a chef who has lost their sense of taste",
    "a time traveler stuck in a traffic jam", "a library book that is fifty years overdue",
    "a small boat crossing a wide ocean", "a street dog who becomes a fire station mascot",
    "the moon getting tired of the night shift", "a potato with big dreams",
    "a mail carrier on the last day before retiring", "a garden gnome who wants to travel",
    "a kite that escapes from its owner", "a piano nobody knows how to play",
    "a rivalry between two bakeries on the same street", "a shy ghost in a busy hotel",
    "the first person to taste chocolate",
]
STORY_FORMS_3 = [
    "a short story", "a poem", "a haiku", "a limerick", "a fable with a moral", "a diary entry",
    "a short scene of dialogue", "a bedtime story for a five-year-old", "the opening paragraph of a novel",
    "a song chorus", "a six-word story",
]
COMPARISONS_3 = [
    ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("stocks", "bonds"),
    ("a Roth IRA", "a traditional IRA"), ("an LLC", "a sole proprietorship"), ("a psychologist", "a psychiatrist"),
    ("a food allergy", "a food intolerance"), ("a latte", "a cappuccino"), ("a violin", "a viola"),
    ("a moth", "a butterfly"), ("a rabbit", "a hare"), ("a frog", "a toad"), ("a turtle", "a tortoise"),
    ("a comet", "an asteroid"), ("a meteor", "a meteorite"), ("an epidemic", "a pandemic"),
    ("a simile", "a metaphor"), ("affect", "effect"), ("empathy", "sympathy"), ("a recession", "a depression"),
    ("a debit card", "a credit card"), ("renting a home", "buying one"), ("leasing a car", "buying a car"),
    ("a lake", "a pond"), ("a sea", "an ocean"), ("an herb", "a spice"), ("a cold", "the flu"),
    ("an ale", "a lager"), ("jam", "jelly"), ("a college", "a university"), ("a sweet potato", "a yam"),
    ("latitude", "longitude"), ("speed", "velocity"), ("mass", "weight"), ("a fact", "an opinion"),
    ("a hypothesis", "a theory"), ("a router", "a modem"), ("RAM", "storage"), ("an e-book", "a paper book"),
    ("a mentor", "a coach"), ("introverts", "extroverts"), ("a virus", "a worm in computer security"),
    ("a museum", "an archive"), ("a condo", "a townhouse"),
]
COMPARISON_TEMPLATES_3 = [
    "What's the difference between {a} and {b}?", "Compare {a} and {b} in a short table.",
    "People often mix up {a} and {b}. How are they different?",
]
TERMS_3 = [
    "serendipity", "entropy", "irony", "gerrymandering", "cognitive dissonance", "the sunk cost fallacy",
    "confirmation bias", "the Dunning-Kruger effect", "osmosis", "herd immunity", "the pH scale",
    "a light-year", "a black swan event", "stagflation", "a bear market", "diversification", "alliteration",
    "onomatopoeia", "a paradox", "an oxymoron", "a euphemism", "schadenfreude", "hygge", "wabi-sabi",
    "the Pareto principle", "Occam's razor", "Murphy's law", "Moore's law", "a catalyst", "an enzyme",
    "homeostasis", "a neuron", "an isotope", "half-life", "inertia", "momentum", "friction", "torque",
    "buoyancy", "mechanical advantage", "an algorithm", "a meme", "the gig economy", "a startup",
    "equity in a company", "a dividend", "an annuity", "an insurance deductible", "net worth",
    "gentrification", "a monopoly", "a cartel", "soft power", "a referendum", "a mnemonic", "nostalgia",
    "impostor syndrome", "the butterfly effect", "a placebo", "a zero-sum game",
]
TERM_TEMPLATES_3 = ["Define {w} and give an example.", "Explain {w} in plain language."]

CODE_TASKS_3 = [
    "converts an integer to English words", "checks whether a Sudoku board is valid",
    "finds the longest common prefix of a list of strings", "run-length encodes a string",
    "decodes a run-length encoded string", "computes the Hamming distance between two strings",
    "encrypts and decrypts text with a Caesar cipher", "generates a random password of a given length",
    "checks whether a number is an Armstrong number", "finds all pairs in a list that add up to a target",
    "computes the moving average of a list of numbers", "rotates a square matrix by 90 degrees",
    "implements a min-heap", "implements a trie for word lookups", "finds the kth largest element in an array",
    "merges overlapping intervals", "flattens a nested dictionary into one with dotted keys",
    "computes the number of days between two dates", "formats a number of bytes as a human-readable size",
    "parses a simple INI-style config file", "implements a token bucket rate limiter",
    "finds the longest increasing subsequence", "solves the coin change problem with dynamic programming",
    "implements the sieve of Eratosthenes", "converts a hex color code to RGB values",
    "checks whether a binary tree is balanced", "computes the depth of a binary tree",
    "serializes a binary tree to a string and back", "finds the majority element in an array",
    "implements a circular buffer", "implements a priority queue", "detects a cycle in a linked list",
    "returns the words that appear in both of two texts", "wraps text to a given line width",
    "prints the ten most frequent words in a text", "converts a Markdown heading to HTML",
    "validates a credit card number with the Luhn algorithm", "generates Pascal's triangle",
    "solves the Tower of Hanoi puzzle", "converts a binary string to a decimal number without built-ins",
    "checks whether two rectangles overlap", "computes the area of a polygon from its vertices",
    "finds the closest pair of numbers in a sorted list", "multiplies two matrices",
    "counts the islands in a grid of 0s and 1s", "implements a state machine for a traffic light",
    "compares two version strings such as 1.2.10 and 1.2.9", "converts camelCase to kebab-case",
    "truncates a string to n characters and adds an ellipsis", "masks all but the last four digits of a card number",
    "groups a list of expenses by month and sums them", "computes the 90th percentile of a list of numbers",
    "normalizes a list of numbers to the range 0 to 1", "finds the mode of a list of numbers",
    "checks whether a string is a valid hexadecimal number", "counts the set bits in an integer",
    "splits a full name into first and last name", "simulates rolling two dice a thousand times",
    "computes one step of Conway's Game of Life", "tokenizes a simple arithmetic expression",
    "evaluates an expression in Reverse Polish Notation", "finds the first non-repeating character in a string",
    "checks whether one string is a rotation of another", "converts minutes into a days-hours-minutes string",
    "finds the longest substring without repeating characters", "checks whether a graph has a cycle",
    "computes the edit distance between two words", "interleaves two lists of different lengths",
    "returns the elements that appear exactly once in a list", "converts a number to a Roman numeral",
    "computes the greatest product of two numbers in an array",
    "generates all valid combinations of n pairs of parentheses",
    "finds the peak element in an array", "draws a text-based histogram from a list of numbers",
    "implements a simple tokenizer that splits text into words and punctuation",
    "calculates a tip and splits a bill between several people",
]
LANGS_3 = ["Python", "Python", "Python", "Python", "JavaScript", "TypeScript", "Java", "C", "Go", "Rust"]
CODE_TEMPLATES_3 = [
    "Write a {lang} function that {task}. Include a few example calls.",
    "How would you implement a {lang} function that {task}? Keep it simple.",
    "Write an efficient {lang} function that {task} and state its time complexity.",
    "I need {lang} code that {task}. Can you write it and explain the tricky parts?",
    "Write a {lang} function that {task}, and point out the edge cases.",
]
JS_TASKS_3 = [
    "debounces another function", "throttles another function", "deep-clones an object",
    "fetches JSON from an API and handles network errors", "implements a small event emitter",
    "formats a date as YYYY-MM-DD", "groups an array of objects by a property",
    "retries a failed fetch with exponential backoff", "toggles a CSS class when a button is clicked",
    "validates a sign-up form before it is submitted", "saves and loads a settings object in localStorage",
    "sorts an array of objects by two keys", "updates a countdown timer on the page every second",
    "memoizes an async function", "flattens a deeply nested array without using flat()",
    "runs a list of promises with at most three at a time", "parses a JSON string safely and returns null on error",
    "copies text to the clipboard when a button is clicked", "lazy-loads images as they scroll into view",
    "builds a URL with query parameters from an object",
]
JS_TEMPLATES_3 = [
    "Write a JavaScript function that {t}.", "Write a TypeScript function with proper types that {t}.",
    "Write a JavaScript function that {t}, and add a short JSDoc comment.",
]
CODE_QUESTIONS_3 = [
    # SQL
    "Write a SQL query that finds the second highest salary in an employees table.",
    "Write a SQL query that counts how many employees work in each department.",
    "Write a SQL query that lists products that have never been sold, given products and sales tables.",
    "Write a SQL query that finds email addresses that appear more than once in a users table.",
    "Write a SQL query that computes a running total of daily revenue.",
    "Write a SQL query that returns the average exam score per student, only for students with at least three exams.",
    "How do I use a window function to rank employees by salary within each department?",
    "Write a SQL query that finds all employees who earn more than the person they report to.",
    "What is the difference between WHERE and HAVING in SQL?",
    "What is the difference between INNER JOIN and LEFT JOIN? Give an example.",
    "How do I pivot monthly sales figures into columns with SQL?",
    "Write a SQL statement that creates a table for blog posts with an auto-incrementing id, a title, a body and a "
    "created_at timestamp.",
    "How do I add an index to a column in PostgreSQL, and when is it worth it?",
    "Write a SQL query that finds the most borrowed book in a library database.",
    "How do I delete rows older than 30 days from a logs table?",
    "Write a SQL query that returns the three highest-rated movies in each genre.",
    "Explain what a common table expression is and show an example in SQL.",
    "How do I update a column in one table using values from another table in SQL?",
    "Write a SQL query that calculates the percentage of deliveries that arrived late.",
    "What does NULL mean in SQL, and why does NULL = NULL not return true?",
    "How can I find the slowest queries in a PostgreSQL database?",
    "Write a SQL query that finds gaps in a sequence of invoice numbers.",
    "What is a transaction in SQL, and what do COMMIT and ROLLBACK do?",
    "Write a SQLite query that groups log entries by hour and counts them.",
    "How do I prevent SQL injection when building queries in Python?",
    # shell and git
    "How do I find which process is using port 8080 on Linux?",
    "Write a bash script that renames all .jpeg files in a folder to .jpg.",
    "How do I undo the last git commit but keep the changes?",
    "What does git cherry-pick do, and when is it useful?",
    "How do I see who last changed a specific line in a file with git?",
    "How do I delete a local git branch and its remote counterpart?",
    "How do I stash changes in git and apply them later?",
    "What does git bisect do, and how do I use it to find a bug?",
    "What should go in a .gitignore file for a Python project?",
    "How do I change the message of my most recent git commit?",
    "Write a bash script that backs up a directory to a timestamped tar.gz archive.",
    "How do I run a command every day at 3 a.m. with cron?",
    "Write a bash one-liner that finds the ten largest files under the current directory.",
    "How do I search recursively for a string with grep while skipping the node_modules folder?",
    "What does chmod 755 mean?",
    "How do I use sed to replace a word in every file in a directory?",
    "Write a bash loop that pings a list of hosts and reports which ones are down.",
    "How do I check how much disk space each folder uses in Linux?",
    "What is the difference between > and >> in bash?",
    "How do I make a bash script stop as soon as any command fails?",
    "How do I pass arguments to a bash script and check that enough were given?",
    "Write a bash script that waits until a website responds before continuing.",
    "How do I use awk to print the second column of a file?",
    "How do I follow a log file in real time and only show lines containing ERROR?",
    "How do I set up SSH keys so I don't have to type a password every time?",
    "How do I copy files to a remote server with rsync, skipping files that haven't changed?",
    "What does the xargs command do? Give an example.",
    "How do I create a Python virtual environment and install packages from requirements.txt?",
    "How do I set an environment variable permanently in bash?",
    "How do I resolve a merge conflict in git, step by step?",
    "How do I tag a release in git and push the tag?",
    "What is a detached HEAD in git, and how do I get out of it?",
    "How do I create a shell alias that persists across sessions?",
    "Write a bash script that reads a file of URLs and downloads each one with curl.",
    "How do I compress and extract a folder with tar?",
    "How do I stop a process that ignores Ctrl+C?",
    "What is the difference between a hard link and a symbolic link?",
    "Write a Makefile with build, test and clean targets for a small C project.",
    # other languages
    "What causes a segmentation fault in C, and how do I debug one?",
    "What is undefined behavior in C? Give a few examples.",
    "Why does 0.1 + 0.2 not equal 0.3 in most programming languages?",
    "What is the difference between the stack and the heap?",
    "Write a C program that reads integers from standard input and prints their sum and average.",
    "Write a C function that safely copies a string into a fixed-size buffer.",
    "Explain how malloc and free work in C, with a small example.",
    "Write a C program that prints the size of int, long, float and double on the current machine.",
    "In C, how do I read a file line by line with fgets?",
    "Write a C function that swaps two integers using pointers.",
    "Write a Java class that represents a library book with a title, an author and a checked-out flag.",
    "In Java, how do I sort a list of objects with a Comparator?",
    "Explain the difference between an interface and an abstract class in Java.",
    "How do I use Java streams to filter and transform a list?",
    "Write a Go program that starts an HTTP server that answers 'hello' on /.",
    "In Go, how do I run several tasks concurrently with goroutines and wait for all of them?",
    "Explain how error handling works in Go, with an example.",
    "Write a Go function that reads a JSON file into a struct.",
    "In Rust, explain ownership and borrowing with a short example.",
    "Write a Rust program that counts how often each word appears in a string.",
    "How do I handle errors with Result and the ? operator in Rust?",
    "Write a Rust struct for a 2D point with a method that computes the distance to another point.",
    "What is the difference between String and &str in Rust?",
    "Write a TypeScript interface for a user profile and a function that validates one.",
    "In TypeScript, what is the difference between a type alias and an interface?",
    "How do generics work in TypeScript? Show an example.",
    # Python
    "Write a Python script that watches a folder and prints the name of every new file.",
    "Write a Python script that sends a GET request to an API and prints the JSON response.",
    "Write a Python command-line tool with argparse that converts kilometers to miles.",
    "Write a Python generator that yields the lines of a large file one at a time.",
    "How do I profile a slow Python script to find the bottleneck?",
    "Write a small Flask app with one route that returns JSON.",
    "How do I run a Python function every ten minutes?",
    "Write a Python script that resizes all images in a folder with Pillow.",
    "How do I use the logging module in Python instead of print statements?",
    "Write pytest tests for a function that converts Celsius to Fahrenheit.",
    "How do I read and write JSON files in Python?",
    "How do I make an HTTP request with a timeout in Python?",
    "How do I use pathlib to list all .py files in a project?",
    "How do I merge two pandas DataFrames on a common column?",
    "Write a Python function that uses a regular expression to extract every date in the format YYYY-MM-DD "
    "from a text.",
    "How do I handle a KeyError when reading from a dictionary in Python?",
    "Write a Python class for a to-do list with add, remove and show methods.",
    "How do I create and use an enum in Python?",
    "How do I sort a dictionary by its values in Python?",
    "How do I run two Python functions in parallel?",
    "Write a Python script that renames the files in a folder by adding today's date as a prefix.",
    "How do I type-annotate a Python function that returns either a string or None?",
]
CONCEPTS_3 = [
    "memoization", "the event loop in JavaScript", "dependency injection", "the observer pattern",
    "the singleton pattern", "the factory pattern", "the SOLID principles", "functional programming", "currying",
    "higher-order functions", "a microservice architecture", "a message queue", "eventual consistency",
    "the CAP theorem", "database normalization", "an ORM", "optimistic locking", "database sharding",
    "a content delivery network", "DNS", "HTTPS and TLS", "OAuth", "JSON Web Tokens", "rate limiting",
    "idempotent API requests", "WebSockets", "a reverse proxy", "a virtual machine", "Kubernetes",
    "infrastructure as code", "semantic versioning", "code review", "test-driven development",
    "integration tests", "property-based testing", "two's complement", "Unicode and UTF-8",
    "bitwise operators", "a Bloom filter", "a trie", "an adjacency list", "topological sorting",
    "the two-pointer technique", "the sliding window technique", "backtracking", "a greedy algorithm",
    "amortized complexity", "a mutex", "a semaphore", "lazy evaluation", "structural pattern matching in Python",
    "the walrus operator in Python", "type inference", "generics", "interfaces in Go",
    "the borrow checker in Rust", "the this keyword in JavaScript", "prototypal inheritance", "null safety",
]
CONCEPT_TEMPLATES_3 = [
    "Explain {c} with a short example.", "When would I actually use {c} in a real project?",
    "Can you give me a simple analogy for {c}?", "What are common pitfalls with {c}?",
    "How would I explain {c} in a job interview?",
]
SNIPPET_TEMPLATES_3 = [
    "Rewrite this function to be more readable, and explain your changes:\n```python\n{s}\n```",
    "What are the inputs and outputs of this function?\n```python\n{s}\n```",
    "Write a few unit tests for this function:\n```python\n{s}\n```",
    "Summarize in one sentence what this function is for:\n```python\n{s}\n```",
    "Add type hints to this function:\n```python\n{s}\n```",
    "What edge cases could break this function?\n```python\n{s}\n```",
]

# A fourth pool, appended after the third (so data shards named by prompt index keep their meaning): all
# 12002 prompts of the first three pools are in use. New subjects and wordings only; none of the held-out subjects.
SUBJECTS_4 = [
    "the Incas", "the Phoenicians", "the Hanseatic League", "the samurai", "ancient Greek theater",
    "the Library of Alexandria", "the Terracotta Army", "Stonehenge", "Angkor Wat", "the Persian Empire",
    "the Celts", "the Etruscans", "medieval castles", "knights and chivalry", "the Underground Railroad",
    "the suffragette movement", "the Rosetta Stone", "Pompeii", "the Dead Sea Scrolls", "the Easter Island statues",
    "static electricity", "superconductors", "lasers", "radioactivity", "the Higgs boson", "neutron stars",
    "supernovas", "the Big Bang", "the Kuiper Belt", "Jupiter's moons", "Saturn's rings", "Venus",
    "gravitational waves", "Einstein's theory of relativity", "crystals", "acids and bases", "polymers",
    "nanotechnology", "CRISPR gene editing", "stem cells", "the lymphatic system", "the kidneys", "the liver",
    "the skin", "hormones", "the nervous system", "taste buds", "the sense of smell", "left-handedness", "twins",
    "vitamins", "dietary fiber", "posture", "migraines", "dental health", "first aid", "hummingbirds", "owls",
    "crows", "jellyfish", "seahorses", "sloths", "koalas", "axolotls", "bamboo", "cacti", "sunflowers",
    "carnivorous plants", "lichens", "earthworms", "monarch butterflies", "deep-sea creatures", "waterfalls",
    "fjords", "sinkholes", "soil", "exchange rates", "central banks", "interest rates", "credit unions",
    "microloans", "the housing market", "crowdfunding", "the sharing economy", "price elasticity",
    "economies of scale", "GDP", "unemployment", "national debt", "pensions", "emergency funds", "student loans",
    "birdwatching", "stamp collecting", "model railways", "amateur astronomy", "geocaching", "fly fishing",
    "bonsai", "quilting", "embroidery", "candle making", "soap making", "magic tricks", "crossword puzzles",
    "jigsaw puzzles", "tabletop role-playing games", "ballroom dancing", "karaoke", "scrapbooking",
    "skateboarding", "surfing", "scuba diving", "archery", "fencing", "table tennis", "kayaking",
    "fiber optic cables", "undersea internet cables", "speech recognition", "facial recognition",
    "large language models", "recommendation algorithms", "smart contracts", "digital privacy", "deepfakes",
    "e-waste", "electric scooters", "lithium mining", "hydrogen fuel", "geothermal energy", "tidal power",
    "smart grids", "the Harlem Renaissance", "baroque music", "Greek mythology", "Norse mythology",
    "fairy tales", "comic books", "manga", "the sonnet", "film noir", "silent films", "musical theater", "ballet",
    "folk music", "mosaics", "stained glass", "the Mona Lisa", "the Japanese tea ceremony", "flamenco",
]
SUBJECT_TEMPLATES_4 = [
    "I know nothing about {t}. Where should I start?", "Teach me the basics of {t} in under 200 words.",
    "What are five surprising things about {t}?", "Write a short explainer on {t} for a general audience.",
    "Write an engaging opening line for a talk about {t}.",
]
THINGS_4 = [
    "a doorbell camera", "a ceiling fan", "a garage door opener", "a lawn sprinkler system", "a water heater",
    "a gas stove", "a rice cooker", "a drip coffee maker", "an espresso machine", "a blender", "a slow cooker",
    "an air fryer", "a dehumidifier", "a humidifier", "an electric bike", "a car's cruise control",
    "a tire pressure sensor", "a catalytic converter", "a spark plug", "a helicopter", "a glider", "a sailboat",
    "a cable car", "a Ferris wheel", "a roller coaster", "a revolving door", "a fingerprint scanner",
    "a chip-and-PIN card", "an ATM", "a self-checkout machine", "a digital thermometer",
    "a blood pressure monitor", "a pulse oximeter", "a contact lens", "a laser printer", "a projector",
    "a webcam", "an optical computer mouse", "a mechanical keyboard", "a smart speaker", "a periscope",
    "a kaleidoscope", "a sundial", "an hourglass", "a water tower", "a city sewer system", "a power grid",
    "a music box", "a cuckoo clock", "a safety pin",
]
THING_TEMPLATES_4 = [
    "What actually happens inside {x} when I use it?", "Explain the science behind {x} in a few sentences.",
    "What can go wrong with {x}, and how is it usually fixed?", "Explain {x} to someone who has never seen one.",
]
HOWTO_4 = [
    "repot a houseplant", "sharpen a kitchen knife", "iron a dress shirt", "sew a button back on",
    "patch a small hole in drywall", "bleed a radiator", "descale a kettle", "clean a front-loading washing machine",
    "get a red wine stain out of a carpet", "track my spending for a month", "build an emergency fund",
    "pay off credit card debt faster", "read a nutrition label", "understand my pay slip",
    "file my taxes for the first time", "choose a health insurance plan", "check a used phone before buying it",
    "pick a ripe watermelon", "keep fresh herbs from wilting", "brew pour-over coffee", "poach an egg",
    "grill vegetables evenly", "write a heartfelt thank-you card", "start a book club", "learn to whistle",
    "solve a Rubik's cube", "shuffle cards like a dealer", "plan a picnic for a group of friends",
    "take care of a leather jacket", "wash a wool sweater without shrinking it", "get my home ready for guests",
    "childproof a home", "find a good family doctor", "prepare for a job fair", "write a professional bio",
    "make a good first impression", "remember people's names", "take useful meeting notes",
    "prioritize a long to-do list", "give constructive feedback", "apologize sincerely",
    "handle a difficult coworker", "start a conversation with a stranger", "calm my nerves before an exam",
    "stop biting my nails", "learn a poem by heart", "plan a weekly menu", "choose a laptop",
    "compare mobile phone plans", "set up two-factor authentication", "spot a phishing email",
    "get my email inbox to zero", "organize the files on my computer", "speed up an old laptop",
    "write a short speech for a retirement party", "teach an old dog a new trick", "clean a dirty oven",
    "get rid of a musty smell in a closet", "frame a poster", "negotiate the price of a used car",
]
HOWTO_TEMPLATES_4 = [
    "What's the best way to {a}?", "Can you explain, step by step, how to {a}?",
    "I've never tried to {a} before. What do I need to know?", "What are beginner mistakes when people try to {a}?",
]
PLACES_4 = [
    "Iceland", "Patagonia", "the Himalayas", "the Alps", "the Andes", "Japan", "Morocco", "Peru", "New Zealand",
    "Norway", "Vietnam", "Portugal", "Kenya", "Mongolia", "the Galápagos Islands", "Madagascar", "the Dead Sea",
    "the Grand Canyon", "Yellowstone National Park", "the Mediterranean Sea", "the Nile", "the Mississippi River",
    "the Danube", "Venice", "Istanbul", "Kyoto", "Mexico City", "Buenos Aires", "Cape Town", "Singapore",
    "Marrakesh", "Prague", "Lisbon", "Edinburgh", "Hawaii", "the Caribbean", "Scandinavia", "the Baltic states",
    "Central Asia", "the Balkans", "the Scottish Highlands", "Tasmania", "Greenland", "the Atacama Desert",
    "Sri Lanka",
]
PLACE_TEMPLATES_4 = [
    "What is {p} best known for?", "What's the geography of {p} like?",
    "I'm visiting {p} for the first time. What should I know before I go?",
    "Tell me a bit about the history and culture of {p}.",
]
MONEY_WORK_QUESTIONS_4 = [
    "How much of my income should I save each month?", "What is the 50/30/20 budgeting rule?",
    "Is it better to pay off debt or invest first?", "How does a credit card's interest actually get calculated?",
    "What should I look for in a savings account?", "How do I start investing with a small amount of money?",
    "What does it mean to rebalance an investment portfolio?", "What is dollar-cost averaging?",
    "Should I lease or finance my first car if I have a tight budget?", "How do I build credit from nothing?",
    "What happens to my retirement account if I change jobs?", "How do I negotiate a lower rent?",
    "What is an employer match, and why do people say not to leave it on the table?",
    "How can I tell whether an investment offer is a scam?", "What fees should I watch out for with a bank?",
    "How do I make a simple household budget with my partner?", "What is inflation doing to my savings?",
    "How do freelancers handle taxes?", "How do I prepare for a performance review?",
    "What should I say when a recruiter asks about my salary expectations?",
    "How do I write a resignation letter that keeps the door open?", "How do I ask my boss for more responsibility?",
    "What are good questions to ask at the end of a job interview?", "How do I explain a gap in my resume?",
    "How can I be more productive in meetings?", "What does a good manager do differently in practice?",
    "How do I handle a coworker who takes credit for my work?", "How do I set boundaries with a demanding boss?",
    "What are signs that it's time to look for a new job?", "How do I write a good LinkedIn summary?",
    "How do I onboard a new employee well?", "How should I prepare for a salary negotiation?",
    "What skills are most useful for a first-time team lead?", "How can I network if I'm an introvert?",
    "Is a master's degree worth it for a career change?", "How do I price my services as a freelance designer?",
    "What is a reasonable emergency fund for a single person?", "How does a mortgage pre-approval work?",
    "What are the hidden costs of owning a home?", "How do I split household bills fairly with roommates?",
]
HEALTH_QUESTIONS_4 = [
    "How much sleep do teenagers really need?", "What is a normal resting heart rate?",
    "Why is too much salt bad for you?", "What are good sources of protein besides meat?",
    "How can I reduce eye strain from looking at screens all day?", "What is the best way to treat a minor burn?",
    "How do I know if a cut needs stitches?", "Why do some people get headaches when they skip coffee?",
    "What does cholesterol do in the body?", "How can I tell a sprained ankle from a broken one?",
    "Is it bad to crack my back?", "What are the early signs of dehydration?",
    "Why is sugar bad for your teeth?", "How does the body fight off a fever?",
    "What are some healthy snacks for a long workday?", "How can I improve my posture at a desk?",
    "What should be in a basic first aid kit at home?", "Why does pollen make your eyes itch?",
    "What does a dietitian do?", "How long does caffeine stay in the body?",
    "Is it safe to take ibuprofen and paracetamol together?", "What are common signs of vitamin D deficiency?",
    "How can I stop grinding my teeth at night?", "Can a better pillow help with neck pain?",
    "What foods are high in iron?", "Why do we get sore throats?", "How can I take care of my hearing?",
    "What should I do if someone is choking?", "How often should I replace my toothbrush?",
    "What are some simple ways to eat more vegetables?",
]
KID_TOPICS_4 = [
    "why we need to sleep", "how the internet sends a photo to grandma", "why the moon changes shape",
    "what germs are", "why we have to brush our teeth", "how money works", "why boats float",
    "how a letter gets delivered", "why some animals hibernate", "why we have day and night", "what atoms are",
    "what a computer program is", "how airplanes land", "how fish breathe underwater", "why ice cream melts",
    "how a bridge holds up cars", "why cats have whiskers", "what a map is for",
    "how a caterpillar becomes a butterfly",
    "where garbage goes after the truck takes it", "how a pencil is made", "why the sea has waves",
    "why people speak different languages", "how a phone call travels", "why we sneeze", "how echoes work",
    "how birds fly", "how chocolate is made", "what negative numbers are", "why we wear seatbelts",
    "how a library works", "why we have bones", "what a fossil is", "why some people need glasses",
    "how a baby bird hatches", "why we get hiccups", "what a calendar is for", "how a lighthouse helps ships",
    "why spiders are not insects", "what recycling does with old bottles",
]
KID_TEMPLATES_4 = [
    "Explain {k} in a way a seven-year-old would understand.",
    "My kid asked me {k}. What's a simple but accurate answer?",
]
LIST_REQUESTS_4 = [
    "List ten board games that work well for two players.", "List eight things to do on a day stuck indoors.",
    "Give me a list of fifteen easy houseplants for beginners.",
    "List ten classic novels that are short enough for a weekend.",
    "List seven ways to save money on utility bills.", "Give me ten conversation starters for a first date.",
    "List twelve fun facts about the deep ocean.", "List ten skills that are useful in almost any job.",
    "Give me a list of icebreaker questions for a team meeting.",
    "List eight ideas for a cheap but fun birthday party.",
    "List ten inventions that changed daily life in the twentieth century.",
    "List ten podcast episode ideas about history.",
    "Give me a list of twenty creative writing prompts.", "List the planets of the solar system with one fact each.",
    "List ten kitchen tools every beginner cook should own.", "List six ways to make a small bedroom feel bigger.",
    "List ten good habits for a new university student.", "Give me a list of fun science experiments for kids.",
    "List eight questions to ask when viewing an apartment.", "List ten things to check before buying a used bike.",
    "List ten names for a golden retriever puppy.", "Give me a list of team names for a pub quiz.",
    "List seven ways to make a long car ride fun for children.",
    "List ten words that are hard to translate into English.",
    "List eight ways to be a better listener.", "List ten famous paintings and who painted them.",
    "Give me a list of ten gift ideas for someone who loves cooking.", "List ten easy ways to use less plastic.",
    "List the steps of the scientific method with a one-line example each.", "List ten hobbies you can start for free.",
    "List eight signs that a website might not be trustworthy.",
    "List ten things to do in the first week at a new job.",
    "Give me a list of questions to ask a doctor at a yearly checkup.",
    "List eight tips for keeping a group chat civil.",
    "List ten pantry staples that last a long time.", "List ten classic movies to watch with teenagers.",
    "List eight ways to practice a foreign language without a class.",
    "List ten world capitals that people often get wrong.",
    "List six ways to keep a journal that you'll actually stick with.", "List ten things a good landlord should do.",
]
STORY_SUBJECTS_4 = [
    "a librarian who can hear books whispering", "a snail entering a race", "a robot vacuum with big ambitions",
    "a pair of old boots remembering their travels", "a girl who trades her shadow for a wish",
    "a small-town radio host on the last broadcast", "a penguin who wants to fly",
    "an inventor whose machines all sing",
    "a bakery that only opens at midnight", "two rival chess players stuck in an elevator",
    "a whale that collects lost ships' bells", "a lonely satellite", "a tea kettle that tells fortunes",
    "a grandfather teaching his grandson to fish", "a tiny island with one mailbox", "a knight afraid of horses",
    "a houseplant that wants to see the world", "a detective who solves crimes by smell",
    "the first day of school for a young dragon", "a ship's cat on a long voyage", "a bridge that can talk",
    "an umbrella that refuses to open", "a mountain village waiting for its first visitor in years",
    "a painter who can only paint what hasn't happened yet", "a pair of socks separated in the wash",
    "a fox who opens a bookshop", "a clockmaker's apprentice", "an elevator that visits a secret floor",
    "a stray kitten on a train", "a snowman who wants to see summer", "an old typewriter in an antique shop",
    "a goldfish planning an escape", "a night-shift nurse", "a squirrel who forgets where it hid everything",
    "a musician's last concert",
]
STORY_FORMS_4 = [
    "a flash fiction piece of under 150 words", "a sonnet", "a free-verse poem", "a nursery rhyme",
    "a short letter written by one of the characters", "a news report", "a two-sentence story",
    "a riddle", "an acrostic poem", "a short monologue", "a postcard message", "a children's picture book text",
]
STORY_TEMPLATES_4 = ["Compose {form} about {s}.", "Could you write {form} featuring {s}?"]
SHORT_TEXTS_4 = [
    "The meeting that was supposed to be on tuesday has been moved to thursday because alot of people cant come, "
    "please update you're calendars.",
    "Our store will be closed on Monday for inventory. We apologize for any inconvenience and look forward to "
    "seeing you on Tuesday.",
    "Hey, so basically the printer on the second floor is broken again and IT says they'll fix it sometime "
    "this week maybe.",
    "The city council voted to extend library opening hours on weekends starting next month, after a survey showed "
    "strong demand from students and families.",
    "i really liked the hotel the staff was super nice but the room was kind of small and the wifi kept dropping",
    "Due to unforeseen circumstances, the annual company picnic has been postponed until further notice.",
    "Octopuses have three hearts and blue blood. Two hearts pump blood to the gills, while the third pumps it to "
    "the rest of the body.",
    "Please remember to wash your mugs before leaving the office kitchen. The sink has been full every evening "
    "this week.",
    "The new app lets users split bills, track shared expenses and send reminders, but it currently only works "
    "with two currencies.",
    "Honey never really spoils. Archaeologists have found pots of honey in ancient tombs that were still edible.",
    "We regret to inform you that your order has been delayed due to high demand. It will ship within 5 to 7 "
    "business days.",
    "Me and him went to the museum yesterday and we seen a dinosaur skeleton that was more bigger than a bus.",
    "The bridge will be closed to cars for repairs from June to August. Pedestrians and cyclists can still use "
    "the walkway.",
    "Studies suggest that reading on paper may help people remember details better than reading on a screen, "
    "although the effect is small.",
    "thx for the invite!! cant make it sat but maybe next time?? have fun!!",
    "The volunteer group planted two hundred trees along the river this spring and plans to add benches next year.",
    "Our quarterly sales grew by eight percent, mostly thanks to online orders, while in-store sales stayed flat.",
    "The recipe calls for two cups of flour, but I only used one and a half and the cookies came out fine.",
    "Applicants must submit a cover letter, a CV and two references by the end of the month to be considered.",
    "The museum's new exhibit features over three hundred photographs documenting life in coastal villages.",
    "After five years of renovation, the old train station has reopened as a market with food stalls and shops.",
    "Due to the high number of requests, responses to support tickets may take up to 48 hours.",
    "My neighbor's dog barks every morning at six, which is annoying, but honestly it's also a pretty good alarm.",
    "The software update fixes several bugs, improves battery life, and adds a dark mode to the settings menu.",
    "Bamboo is one of the fastest-growing plants on Earth; some species can grow almost a meter in a single day.",
    "Parking in the north lot will be unavailable next week while the lines are repainted.",
    "The team finished the project two weeks early and under budget, so management approved a celebration lunch.",
    "The word 'quarantine' comes from the Italian for forty days, the period ships had to wait before docking.",
]
REWRITE_TEMPLATES_4 = [
    "Rewrite this in a more formal tone:\n\n{x}", "Make this text shorter and clearer:\n\n{x}",
    "Summarize this in one sentence:\n\n{x}", "Correct the grammar, spelling and punctuation in this text:\n\n{x}",
    "Rewrite this so a child could understand it:\n\n{x}", "Turn this into bullet points:\n\n{x}",
    "Make this sound friendlier and more upbeat:\n\n{x}",
]
PEOPLE_4 = [
    "Marie Curie", "Ada Lovelace", "Nikola Tesla", "Leonardo da Vinci", "Cleopatra", "Frida Kahlo",
    "Mahatma Gandhi", "Nelson Mandela", "Isaac Newton", "Galileo Galilei", "Charles Darwin", "Florence Nightingale",
    "Harriet Tubman", "Confucius", "Socrates", "Ibn Battuta", "Marco Polo", "Johann Sebastian Bach",
    "Ludwig van Beethoven", "Jane Austen", "Mark Twain", "Rosalind Franklin", "Alan Turing", "Grace Hopper",
    "Katherine Johnson", "Louis Pasteur", "Alexander Fleming", "Queen Victoria", "Hatshepsut", "Mansa Musa",
    "Simón Bolívar", "Catherine the Great", "Akbar the Great", "Hypatia", "Avicenna", "Nicolaus Copernicus",
    "Amelia Earhart", "the Wright brothers", "Vincent van Gogh", "Michelangelo",
]
PERSON_TEMPLATES_4 = [
    "Who was {n}, and why are they remembered?", "What were the biggest achievements of {n}?",
    "Tell me an interesting story from the life of {n}.",
]
COMPARISONS_4 = [
    ("a crow", "a raven"), ("a cheetah", "a leopard"), ("a dolphin", "a porpoise"), ("a bee", "a wasp"),
    ("a geyser", "a hot spring"), ("a bay", "a gulf"), ("a hill", "a mountain"), ("England", "Great Britain"),
    ("an atom", "a molecule"), ("an element", "a compound"), ("alternating current", "direct current"),
    ("a fuse", "a circuit breaker"), ("an ETF", "a mutual fund"), ("a will", "a living trust"),
    ("gross income", "net income"), ("a salary", "an hourly wage"), ("a résumé", "a CV"),
    ("espresso", "drip coffee"), ("butter", "margarine"), ("white rice", "brown rice"), ("green tea", "black tea"),
    ("sushi", "sashimi"), ("a stew", "a soup"), ("a crêpe", "a pancake"), ("baking", "roasting"),
    ("a novel", "a novella"), ("a play", "a musical"), ("a watercolor", "an oil painting"), ("a laptop", "a tablet"),
    ("Bluetooth", "Wi-Fi"), ("a password", "a passkey"), ("a mobile app", "a website"),
    ("a nap", "a full night's sleep"), ("a sprain", "a strain"), ("a dentist", "an orthodontist"),
    ("a nutritionist", "a dietitian"), ("a cooperative", "a corporation"), ("a loan", "a line of credit"),
]
COMPARISON_TEMPLATES_4 = [
    "How can I tell {a} and {b} apart?", "Explain how {a} differs from {b}, with an example.",
    "In a few bullet points, contrast {a} with {b}.",
]
TERMS_4 = [
    "a straw man argument", "an ad hominem attack", "a false dichotomy", "survivorship bias",
    "the bystander effect", "the halo effect", "loss aversion", "the anchoring effect", "the Streisand effect",
    "the frequency illusion", "the Peter principle", "Parkinson's law", "Goodhart's law", "Hanlon's razor",
    "the tragedy of the commons", "a Ponzi scheme", "liquidity", "collateral", "amortization", "a capital gain",
    "an APR", "a bull market", "a hedge fund", "short selling", "a supply shock", "deflation", "purchasing power",
    "a trade deficit", "symbiosis", "camouflage", "metamorphosis", "an ecosystem", "a food chain",
    "an invasive species", "biodiversity", "erosion", "a watershed", "an estuary", "a peninsula", "an archipelago",
    "an isthmus", "a river delta", "iambic pentameter", "foreshadowing", "an unreliable narrator", "satire",
    "a cliffhanger", "hyperbole", "personification", "a Freudian slip", "déjà vu", "FOMO", "a growth mindset",
    "emotional intelligence", "the Overton window", "a red herring", "a catch-22", "a rule of thumb",
]
TERM_TEMPLATES_4 = [
    "What does {w} mean? Use it in a sentence.", "Give me a real-world example of {w}, and explain it briefly.",
]
EVERYDAY_QUESTIONS_4 = [
    "Why do we get dizzy after spinning around?", "Why does helium make your voice sound funny?",
    "Why do cats knead blankets?", "Why do dogs tilt their heads when you talk to them?",
    "Why do mirrors flip left and right but not up and down?", "Why do we get sleepy after a big lunch?",
    "Why does a spoon look bent in a glass of water?", "Why does shaken soda fizz over when you open it?",
    "Why do paper cuts hurt so much?", "Why do some people sneeze when they look at bright light?",
    "Why does my stomach growl?", "How do farmers grow seedless grapes?", "Why do we shiver?",
    "Why do wet dogs shake themselves?", "Why do cows chew cud?", "How can horses sleep standing up?",
    "How do owls turn their heads so far?", "Why do rubber bands snap back?", "How do self-cleaning ovens work?",
    "Why do we get pins and needles?", "Why do we have eyebrows?", "Why is blood red?",
    "Why do some people have freckles?", "Why does a teenager's voice crack?", "How do tattoos stay in the skin?",
    "Why do cats love sitting in boxes?", "Why do giraffes have such long necks?",
    "How do camels go so long without drinking?", "Why does Swiss cheese have holes?", "How is decaf coffee made?",
    "Why are most pencils painted yellow?", "Why do clocks run clockwise?", "Why do keyboards use the QWERTY layout?",
    "Why is a week seven days long?", "Why do people say 'bless you' after a sneeze?",
    "Why do golf balls have dimples?",
    "How do non-stick pans work?", "Why does my laptop get hot?", "Why does some music give people chills?",
    "Why do songs get stuck in our heads?", "Why can't we tickle ourselves?", "How do pigeons find their way home?",
    "How do ducks stay dry in the water?", "How do wood frogs survive being frozen?", "Why do we blush?",
    "How do I get candle wax off a tablecloth?", "How can I keep cut flowers fresh longer?",
    "How do I stop my shoelaces from coming untied?", "How do I clean a smelly kitchen sponge?",
    "How can I stop a door from squeaking?", "How do I remove sticker residue from glass?",
    "How can I tell if an avocado is ripe?", "How do I unshrink a sweater?", "How do I get rid of hiccups quickly?",
    "Why do apples float but pears often sink?", "Why does a cat's tongue feel rough?",
    "Why do we lose our baby teeth?", "Why do people have different eye colors?",
    "How do noise complaints usually get resolved between neighbors?", "Why is it hard to read in a moving car?",
]
SITUATIONS_4 = [
    "about to start working night shifts", "getting married next month and stressed about money",
    "new to managing a small team", "trying to learn the piano at 40", "feeling stuck in a job I've had for ten years",
    "helping my elderly father learn to use a smartphone", "caring for a sick old dog",
    "struggling with a two-hour daily commute", "trying to stop impulse buying online", "about to take a gap year",
    "nervous about my first solo trip abroad", "trying to get my teenager to talk to me more",
    "dealing with a noisy upstairs neighbor", "moving in with my partner for the first time",
    "preparing for a big family reunion", "starting a side business while working full time",
    "feeling down after being rejected from a job I really wanted", "returning to work after parental leave",
    "planning to retire in two years", "a student with three exams in one week",
    "sharing an office with a very chatty colleague", "caring for a newborn and a toddler at the same time",
    "trying to make my small balcony feel cozy", "trying to write every day but I keep skipping days",
    "worried about an upcoming medical test", "hosting my in-laws for a whole week", "learning to drive at 30",
    "behind on my tax return and I keep putting it off", "dealing with a friend who keeps canceling plans",
    "about to give my first wedding speech as the best man",
]
SITUATION_TEMPLATES_4 = [
    "Here's my situation: I'm {s}. Any advice?", "I'm {s}. How should I think about this?",
    "I'm {s}. What would you do in my place?",
]
MESSAGES_4 = [
    "thanking a host after staying at their home", "telling my team that the weekly meeting has moved",
    "asking a neighbor to water my plants while I travel", "inviting a new colleague for coffee",
    "declining a wedding invitation", "asking a happy customer to leave a review", "welcoming a new hire to the team",
    "announcing a product update to customers", "asking my landlord for permission to get a cat",
    "asking a client for a few more days to finish a report", "sharing news of a budget cut with my team",
    "asking a school about enrollment for my daughter", "disputing a wrong charge on a hotel bill",
    "congratulating a colleague on a promotion", "offering condolences to a coworker",
    "asking a friend to return a book I lent them", "explaining to a client why our prices are going up",
    "inviting a speaker to a community event", "asking a local bakery to donate to a charity raffle",
    "following up after meeting someone at a conference", "asking for a payment plan on a medical bill",
    "thanking volunteers after a fundraiser", "telling a friend I can't make it to their party",
    "asking my team for ideas for the next offsite", "introducing two contacts who should meet",
]
MESSAGE_TEMPLATES_4 = [
    "Can you draft a message {m}?", "Write a brief, courteous note {m}.",
    "I need to send an email {m}. Could you write it for me?",
]
DISHES_4 = [
    "a Spanish tortilla", "pad thai", "bibimbap", "a chicken tagine", "jollof rice", "potato pierogi", "gazpacho",
    "fish and chips", "a homemade beef burger", "pulled pork", "chicken tikka masala", "a poke bowl", "empanadas",
    "tiramisu", "crème brûlée", "cinnamon rolls", "focaccia", "a Victoria sponge cake", "corn tortillas",
    "clam chowder", "spring rolls", "lamb kebabs", "a Waldorf salad", "fresh lemonade", "a mango lassi",
]
DISH_TEMPLATES_4 = [
    "Walk me through making {d} at home.", "What ingredients do I need for {d}, and what's the method?",
    "What usually goes wrong when people make {d}?",
]
EVENTS_4 = [
    "the building of the pyramids of Giza", "the eruption of Mount Vesuvius in 79 AD", "the sinking of the Titanic",
    "the Wright brothers' first flight", "the discovery of penicillin", "the invention of the telephone",
    "the founding of the United Nations", "the Marshall Plan", "the Berlin Airlift", "the Korean War",
    "the civil rights movement in the United States", "the end of apartheid in South Africa",
    "the Boston Tea Party", "the Louisiana Purchase", "the Lewis and Clark expedition", "the Klondike Gold Rush",
    "the building of the Panama Canal", "the opening of the Suez Canal", "the golden age of the Tang dynasty",
    "the 1918 flu pandemic", "the Great Fire of London", "the 1906 San Francisco earthquake",
    "the first modern Olympic Games in 1896", "the invention of the steam engine",
    "the abolition of the transatlantic slave trade", "the Human Genome Project",
    "the laying of the first transatlantic telegraph cable", "the reign of Elizabeth I", "the Tokugawa shogunate",
]
EVENT_TEMPLATES_4 = [
    "What happened during {e}, in a nutshell?", "How did {e} change the world afterward?",
    "Who were the key people in {e}, and what did they do?",
]

CODE_TASKS_4 = [
    "parsing a duration string like '2h45m' into seconds", "converting a Unix timestamp to a readable date",
    "grouping a list of words into sets of anagrams", "computing the check digit of an ISBN-10 number",
    "generating a random maze with depth-first search", "simulating a simple vending machine",
    "building a tiny key-value store that saves to a file", "tracking the min, max and mean of a stream of numbers",
    "guessing the language of a text from its letter frequencies", "converting a nested dictionary to XML",
    "printing a list of rows as a table with aligned columns", "finding the longest common substring of two strings",
    "computing the day of the week for any date", "building a simple spell checker that suggests close words",
    "ordering tasks so that each one runs after its dependencies", "finding the shortest word ladder between two words",
    "validating a phone number in the format 555-123-4567", "extracting all hashtags from a social media post",
    "roughly counting the syllables in an English word", "implementing undo and redo for a text editor",
    "writing a small matrix class with addition and multiplication", "adding two huge numbers given as strings",
    "multiplying two huge numbers given as strings", "rounding money amounts correctly to two decimal places",
    "printing a calendar for a given month", "computing the angle between the hands of a clock",
    "checking whether a point lies inside a polygon", "finding the convex hull of a set of points",
    "implementing a union-find (disjoint set) structure", "finding connected components in an undirected graph",
    "computing a minimum spanning tree with Kruskal's algorithm", "implementing A* pathfinding on a grid",
    "flood-filling a region of a 2D grid", "solving the N-queens puzzle", "solving a Sudoku puzzle with backtracking",
    "finding all subsets of numbers that add up to a target", "implementing a skip list",
    "computing the SHA-256 hash of a large file in chunks", "comparing two directories and listing the differences",
    "following a growing log file and printing new lines", "rotating a log file when it gets too big",
    "restarting a worker process whenever it crashes", "parsing command-line flags without a library",
    "reading settings from environment variables with defaults", "loading configuration from a YAML file",
    "sending an email with an attachment", "downloading several files in parallel", "building a small URL shortener",
    "adding a health-check endpoint to a web service", "paginating a long list of results",
    "filling in a text template that has {name}-style placeholders", "escaping HTML special characters",
    "stripping HTML tags from a string", "turning an article title into a URL slug",
    "generating a UUID and validating its format", "encoding and decoding Base64 by hand",
    "binary searching a sorted array that has been rotated", "finding the median of two sorted arrays",
    "merging k sorted lists efficiently", "finding the k most frequent words in a text",
    "counting the inversions in an array", "implementing counting sort", "implementing radix sort",
    "implementing insertion sort", "implementing heap sort",
    "sorting file names in natural order (file2 before file10)",
    "finding the longest run of consecutive integers in an unsorted list",
    "counting the business days between two dates", "converting a meeting time between time zones",
    "checking whether a string is valid JSON", "evaluating arithmetic expressions with operator precedence",
    "drawing an ASCII-art diamond of a given size", "printing the elements of a matrix in spiral order",
    "estimating pi with random sampling", "computing square roots with Newton's method",
    "solving a quadratic equation, including complex roots", "converting prices between currencies with a rate table",
    "computing body mass index and its category", "validating the format of a UK postcode",
    "abbreviating large numbers, so 1500000 becomes 1.5M", "throttling a loop to at most ten iterations per second",
]
LANGS_4 = [
    "Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C#", "Kotlin", "Swift", "Ruby",
    "C++", "PHP",
]
CODE_TEMPLATES_4 = [
    "In {lang}, what's the cleanest code for {task}? Add a short usage example.",
    "Using {lang}, how would I go about {task}?",
    "Show me clean, idiomatic {lang} for {task}.", "I'm learning {lang}. Can you walk me through {task}?",
    "What's a good approach in {lang} for {task}? Please include code.",
]
SHELL_TASKS_4 = [
    "renaming every file in a folder to lowercase", "finding files that were modified in the last 24 hours",
    "deleting empty directories recursively", "showing the 20 most recently changed files",
    "replacing spaces with underscores in file names", "checking whether a command exists before running it",
    "printing the total size of all .log files", "extracting the domain names from a list of URLs",
    "sorting a file of numbers and printing the unique ones", "monitoring memory usage every few seconds",
    "killing all processes started by a specific script", "splitting a big file into 100 MB pieces",
    "joining split files back together", "converting a folder of PNG images to JPEG",
    "finding which package provides a command on Ubuntu", "listing the open network connections",
    "checking the SSL certificate expiry date of a website", "timing how long a command takes",
    "running a command in the background and logging its output", "retrying a flaky command up to five times",
    "reading a config file of key=value lines into variables", "generating a random 16-character password",
    "comparing two text files side by side", "finding duplicate file names in different folders",
    "archiving files older than 90 days", "emptying a file without deleting it",
    "printing a file's contents with line numbers", "counting how many unique IP addresses are in an access log",
    "watching a directory and running tests when a file changes", "checking free disk space and warning when low",
    "creating a user and adding them to a group", "downloading a file only if it has changed",
    "batch-resizing photos from the command line", "searching compressed .gz logs for a word",
    "showing the environment variables that contain PATH", "setting up a simple HTTP server for the current folder",
]
SHELL_TEMPLATES_4 = [
    "What's the Linux command line way of {t}?", "Write a small shell script for {t}, with comments.",
    "Is there a one-liner for {t}? Please explain each part.",
]
SQL_TASKS_4 = [
    "listing the orders placed in the last seven days", "finding users who signed up but never logged in",
    "counting the number of orders per weekday", "finding the longest streak of consecutive login days per user",
    "listing the top three products in each category by units sold", "computing month-over-month revenue growth",
    "finding employees hired in the same month as their manager", "removing duplicate rows while keeping the newest",
    "finding the median order amount", "returning each customer's first and most recent purchase date",
    "finding products whose price changed in the last month", "listing students enrolled in every course",
    "computing the average delivery time per city", "finding overlapping hotel bookings for the same room",
    "showing the share of total sales for each region", "counting active users per month",
    "finding the busiest hour of the day in a visits table", "listing flights that depart and arrive on different days",
    "tagging each order as small, medium or large with CASE", "finding authors who wrote more than five books",
    "listing departments with no employees", "computing a 7-day rolling average of sign-ups",
    "finding the gap in days between each user's orders", "returning rows where a JSON column contains a key",
    "archiving last year's rows into a history table", "merging new rows into a table, updating ones that exist",
    "pivoting survey answers into one column per question", "finding the most common pair of products bought together",
]
SQL_TEMPLATES_4 = [
    "How would I write SQL for {t}?", "Give me a PostgreSQL query for {t}, and explain it.",
    "Help me with a SQL query for {t}.",
]
REGEX_TASKS_4 = [
    "matching a time in 24-hour HH:MM format", "finding repeated words like 'the the' in a text",
    "matching a hex color such as #1a2b3c", "extracting the numbers from a string like 'Order 12 of 340'",
    "validating a username of 3 to 16 letters, digits or underscores", "matching a date in DD/MM/YYYY format",
    "capturing the key and value in lines like key = value", "matching an IPv6 address in its simple form",
    "finding words that start with a capital letter", "removing extra spaces between words",
    "matching a semantic version number like 2.14.3", "extracting the text between square brackets",
    "matching a price like $1,299.99", "splitting camelCase words into separate words",
    "matching a line that does not contain the word error", "extracting the file extension from a path",
    "checking that a password has a digit, a letter and a symbol", "matching HTML comments",
    "finding lines that start with a hash sign", "extracting the query string from a URL",
    "matching a US ZIP code with an optional four-digit suffix", "pulling the @mentions out of a message",
    "masking all digits in a string except the last four", "matching balanced single and double quotes",
]
REGEX_TEMPLATES_4 = [
    "Write a regular expression for {t}, and explain how it works.",
    "What regex would you use for {t}? Show it in Python.",
]
DEV_QUESTIONS_4 = [
    # git
    "How do I squash my last three commits into one?", "How do I see what changed between two git branches?",
    "How do I recover a branch I deleted by mistake in git?", "What's the difference between git fetch and git pull?",
    "How do I remove a file from git history that contains a password?", "How do I rename a git branch?",
    "How can I make git ignore changes to a file that is already tracked?",
    "What's a good git branching strategy for a small team?", "How do I write a good commit message?",
    "How do I revert a commit that was already pushed?", "What is a git submodule, and should I use one?",
    "How do I configure my name and email for git on a new computer?",
    "How do I list all the files changed in a specific commit?", "How do I apply a patch file with git?",
    "What does git reset --hard do, and why is it dangerous?", "How do I clone only the latest commit of a big repo?",
    # Docker
    "How do I write a Dockerfile for a small Python web app?", "How do I make my Docker image smaller?",
    "What's the difference between a Docker image and a container?", "How do I see the logs of a running container?",
    "How do I pass environment variables to a Docker container?", "What is a Docker volume, and when do I need one?",
    "How do I run a shell inside a running Docker container?", "Write a docker-compose file for a web app and Redis.",
    "Why does my Docker build reinstall all dependencies every time I change one file?",
    "How do I clean up old Docker images and stopped containers?", "What does EXPOSE do in a Dockerfile?",
    "How do I let two containers talk to each other?", "What is a multi-stage Docker build?",
    # web
    "What happens when I type a URL into the browser and press Enter?",
    "What's the difference between GET and POST requests?", "How do cookies and sessions keep a user logged in?",
    "How do I center a div horizontally and vertically with CSS?", "What is the box model in CSS?",
    "How do I make a web page look good on phones?", "What's the difference between localStorage and sessionStorage?",
    "How do I send form data to a server with fetch?", "What does HTTP status 404 mean compared with 500?",
    "How do I add a favicon to a website?", "What is a CDN, and should a small site use one?",
    "How do I prevent a form from being submitted twice?", "What's the difference between PUT and PATCH?",
    "How do I make an HTML table sortable by clicking a column header?", "What are HTTP headers used for?",
    "How do I serve a static website for free?", "How do I debug JavaScript in the browser's developer tools?",
    "What is the difference between async and defer on a script tag?", "How do I set up HTTPS for my own domain?",
    # Python and tools
    "How do I parse dates in many different formats in Python?", "How do I use dataclasses to replace a plain dict?",
    "How do I write a Python context manager with contextlib?", "How do I make a Python package installable with pip?",
    "How do I use itertools.groupby correctly?", "How do I schedule a Python script on Windows?",
    "How do I measure memory usage of a Python object?", "How do I read a large JSON Lines file efficiently?",
    "How do I use collections.Counter to tally items?", "How do I handle Ctrl+C gracefully in a Python script?",
    "How do I run shell commands from Python and capture their output?",
    "How do I format numbers with commas in Python?",
    "How do I compare two floats safely in Python?", "How do I use functools.lru_cache?",
    "How do I write a simple async HTTP client with asyncio?",
    "What's the right way to structure a small Python project?",
]
ERRORS_4 = [
    "TypeError: 'NoneType' object is not subscriptable", "IndexError: list index out of range",
    "ModuleNotFoundError: No module named 'requests'",
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0",
    "RecursionError: maximum recursion depth exceeded", "ValueError: too many values to unpack (expected 2)",
    "AttributeError: 'str' object has no attribute 'append'", "ZeroDivisionError: division by zero",
    "TypeError: unhashable type: 'list'", "IndentationError: unexpected indent",
    "UnboundLocalError: local variable 'count' referenced before assignment",
    "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
    "PermissionError: [Errno 13] Permission denied", "FileNotFoundError: [Errno 2] No such file or directory",
    "TypeError: Cannot read properties of undefined (reading 'map')", "ReferenceError: total is not defined",
    "Uncaught SyntaxError: Unexpected token '<'", "No 'Access-Control-Allow-Origin' header is present",
    "error: failed to push some refs", "fatal: not a git repository", "java.lang.NullPointerException",
    "java.lang.OutOfMemoryError: Java heap space", "java.util.ConcurrentModificationException",
    "undefined reference to `main'", "error[E0382]: borrow of moved value",
    "panic: runtime error: index out of range", "fatal error: all goroutines are asleep - deadlock!",
    "bash: ./run.sh: Permission denied", "Cannot connect to the Docker daemon",
    "npm ERR! ERESOLVE unable to resolve dependency tree", "ssh: connect to host port 22: Connection refused",
    "duplicate key value violates unique constraint", "sqlite3.OperationalError: database is locked",
    "OSError: [Errno 98] Address already in use", "SSL: CERTIFICATE_VERIFY_FAILED",
]
ERROR_TEMPLATES_4 = [
    "I keep getting this error: {e}\nWhat does it mean, and how do I fix it?",
    "What usually causes `{e}`, and how can I track it down?",
]
BUGGY_CODE_4 = [
    ("Python", "python", "def add_item(item, items=[]):\n    items.append(item)\n    return items"),
    ("Python", "python", "total = 0\nfor i in range(1, 10):\n    total += i\nprint('sum of 1 to 10 is', total)"),
    ("Python", "python", "nums = [1, 2, 3, 4, 5, 6]\nfor n in nums:\n    if n % 2 == 0:\n        nums.remove(n)\n"
                         "print(nums)"),
    ("Python", "python", "funcs = []\nfor i in range(3):\n    funcs.append(lambda: i)\nprint([f() for f in funcs])"),
    ("Python", "python", "def average(values):\n    total = sum(values)\n    total / len(values)\n\n"
                         "print(average([2, 4, 6]))"),
    ("Python", "python", "list = [3, 1, 2]\nlist.sort()\nitems = list(range(5))"),
    ("Python", "python", "price = 0.1 + 0.2\nif price == 0.3:\n    print('exact')\nelse:\n    print('not exact')"),
    ("Python", "python", "try:\n    value = int(input('Number: '))\n    result = 100 / value\nexcept:\n    pass\n"
                         "print(result)"),
    ("Python", "python", "with open('notes.txt', 'w') as f:\n    f.write('hello')\n    print(f.read())"),
    ("Python", "python", "name = input('Name: ')\nif name is 'admin':\n    print('welcome back')"),
    ("JavaScript", "javascript", "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}"),
    ("JavaScript", "javascript", "const scores = [10, 9, 100, 25];\nscores.sort();\nconsole.log(scores);"),
    ("JavaScript", "javascript", "async function load() {\n  const res = fetch('/api/items');\n"
                                 "  const data = res.json();\n  return data;\n}"),
    ("JavaScript", "javascript", "if (userInput == 0) {\n  console.log('empty');\n}"),
    ("JavaScript", "javascript", "const settings = { theme: 'dark' };\nconst copy = settings;\n"
                                 "copy.theme = 'light';\nconsole.log(settings.theme);"),
    ("C", "c", "int main(void) {\n    int a[5];\n    for (int i = 0; i <= 5; i++)\n        a[i] = i * 2;\n"
               "    return 0;\n}"),
    ("C", "c", "switch (level) {\n    case 1: puts(\"low\");\n    case 2: puts(\"medium\");\n"
               "    default: puts(\"high\");\n}"),
    ("C", "c", "char *greet(void) {\n    char msg[] = \"hello\";\n    return msg;\n}"),
    ("Java", "java", "String a = new String(\"yes\");\nif (a == \"yes\") {\n    System.out.println(\"match\");\n}"),
    ("Go", "go", "var wg sync.WaitGroup\nfor i := 0; i < 3; i++ {\n    go func() {\n        fmt.Println(i)\n"
                 "        wg.Done()\n    }()\n}\nwg.Wait()"),
]
BUG_TEMPLATES_4 = [
    "This {lang} code doesn't do what I expect. What's wrong?\n```{fence}\n{code}\n```",
    "Find and fix the bug in this {lang} snippet:\n```{fence}\n{code}\n```",
    "What will this {lang} code actually do, and is that a bug?\n```{fence}\n{code}\n```",
]
CONCEPTS_4 = [
    "the call stack", "a stack trace", "a REPL", "a package manager", "a lock file", "a build system",
    "a monorepo", "feature flags", "blue-green deployment", "canary releases", "observability", "structured logging",
    "the circuit breaker pattern", "backpressure", "a thread pool", "a cron job", "a daemon process",
    "a file descriptor", "a network socket", "TCP and UDP", "a subnet mask", "NAT", "load testing", "flaky tests",
    "test fixtures", "snapshot testing", "code coverage", "static and dynamic typing", "duck typing",
    "operator overloading", "a variadic function", "an enum", "a union type", "short-circuit evaluation",
    "integer overflow", "endianness", "a bitmask", "a checksum", "serialization", "Protocol Buffers", "GraphQL",
    "a webhook", "server-side rendering", "the DOM", "CSS flexbox", "CSS grid", "a single-page application",
    "a service worker", "web accessibility", "a CSRF attack", "cross-site scripting", "password salting",
    "public-key cryptography", "a digital signature", "side effects", "a B-tree", "a write-ahead log", "MapReduce",
    "broadcasting in NumPy", "dunder methods in Python", "__slots__ in Python", "descriptors in Python",
    "metaclasses in Python", "weak references", "the global and nonlocal keywords",
]
CONCEPT_TEMPLATES_4 = [
    "What problem does {c} solve?", "Give me a concrete example of {c} and walk through it.",
    "What's a common misunderstanding about {c}?", "How would a senior engineer explain {c} to a junior colleague?",
]
SNIPPET_TEMPLATES_4 = [
    "Walk me through what this function returns for a typical input:\n```python\n{s}\n```",
    "How could this function be simplified?\n```python\n{s}\n```",
    "Translate this Python function into JavaScript:\n```python\n{s}\n```",
    "Which Python features does this function rely on?\n```python\n{s}\n```",
    "Write a Google-style docstring for this function:\n```python\n{s}\n```",
    "Can this function raise an exception? When?\n```python\n{s}\n```",
    "Describe this function's algorithm in plain English:\n```python\n{s}\n```",
    "Suggest clearer names for this function and its variables:\n```python\n{s}\n```",
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


def third_prompts(rng: random.Random) -> list[str]:
    """The third pool: new subjects, everyday questions, creative writing, and new code tasks and questions."""
    chat = [tpl.format(t=t) for t in SUBJECTS_3 for tpl in SUBJECT_TEMPLATES_3]
    chat += [tpl.format(x=x) for x in THINGS_3 for tpl in THING_TEMPLATES_3]
    chat += [tpl.format(a=a) for a in ACTIVITIES_3 for tpl in ACTIVITY_TEMPLATES_3]
    chat += [tpl.format(d=d) for d in DISHES_3 for tpl in DISH_TEMPLATES_3]
    chat += [tpl.format(e=e) for e in EVENTS_3 for tpl in EVENT_TEMPLATES_3]
    chat += [tpl.format(m=m) for m in MESSAGES_3 for tpl in MESSAGE_TEMPLATES_3]
    chat += EVERYDAY_QUESTIONS_3 + [tpl.format(s=s) for s in SITUATIONS_3 for tpl in SITUATION_TEMPLATES_3]
    chat += [f"Write {form} about {s}." for s in STORY_SUBJECTS_3 for form in rng.sample(STORY_FORMS_3, 5)]
    chat += [tpl.format(a=a, b=b) for a, b in COMPARISONS_3 for tpl in COMPARISON_TEMPLATES_3]
    chat += [tpl.format(w=w) for w in TERMS_3 for tpl in TERM_TEMPLATES_3]
    code = [tpl.format(lang=rng.choice(LANGS_3), task=task) for task in CODE_TASKS_3 for tpl in CODE_TEMPLATES_3]
    code += [tpl.format(t=t) for t in JS_TASKS_3 for tpl in JS_TEMPLATES_3] + CODE_QUESTIONS_3
    code += [tpl.format(c=c) for c in CONCEPTS_3 for tpl in CONCEPT_TEMPLATES_3]
    code += [rng.choice(SNIPPET_TEMPLATES_3).format(s=s) for s in stdlib_snippets(1000, random.Random(8765))]
    rng.shuffle(chat)
    rng.shuffle(code)
    return _alternate(chat, code)


def _off_topic_4(line: str) -> bool:
    """True for a snippet whose signature touches a held-out subject (kept out of the fourth pool)."""
    return any(w in line.lower() for w in ("palindrom", "fib", "factorial", "revers", "dup", "csv", "hash"))


def fourth_prompts(rng: random.Random) -> list[str]:
    """The fourth pool: new subjects, places, people, how-tos, rewriting, and new code, shell, SQL and debugging."""
    chat = [tpl.format(t=t) for t in SUBJECTS_4 for tpl in SUBJECT_TEMPLATES_4]
    chat += [tpl.format(x=x) for x in THINGS_4 for tpl in THING_TEMPLATES_4]
    chat += [tpl.format(a=a) for a in HOWTO_4 for tpl in HOWTO_TEMPLATES_4]
    chat += [tpl.format(p=p) for p in PLACES_4 for tpl in PLACE_TEMPLATES_4]
    chat += MONEY_WORK_QUESTIONS_4 + HEALTH_QUESTIONS_4 + LIST_REQUESTS_4 + EVERYDAY_QUESTIONS_4
    chat += [tpl.format(k=k) for k in KID_TOPICS_4 for tpl in KID_TEMPLATES_4]
    chat += [rng.choice(STORY_TEMPLATES_4).format(form=form, s=s)
             for s in STORY_SUBJECTS_4 for form in rng.sample(STORY_FORMS_4, 5)]
    chat += [tpl.format(x=x) for x in SHORT_TEXTS_4 for tpl in rng.sample(REWRITE_TEMPLATES_4, 4)]
    chat += [tpl.format(n=n) for n in PEOPLE_4 for tpl in PERSON_TEMPLATES_4]
    chat += [tpl.format(a=a, b=b) for a, b in COMPARISONS_4 for tpl in COMPARISON_TEMPLATES_4]
    chat += [tpl.format(w=w) for w in TERMS_4 for tpl in TERM_TEMPLATES_4]
    chat += [tpl.format(s=s) for s in SITUATIONS_4 for tpl in SITUATION_TEMPLATES_4]
    chat += [tpl.format(m=m) for m in MESSAGES_4 for tpl in MESSAGE_TEMPLATES_4]
    chat += [tpl.format(d=d) for d in DISHES_4 for tpl in DISH_TEMPLATES_4]
    chat += [tpl.format(e=e) for e in EVENTS_4 for tpl in EVENT_TEMPLATES_4]
    code = [tpl.format(lang=rng.choice(LANGS_4), task=task) for task in CODE_TASKS_4 for tpl in CODE_TEMPLATES_4]
    code += [tpl.format(t=t) for t in SHELL_TASKS_4 for tpl in SHELL_TEMPLATES_4]
    code += [tpl.format(t=t) for t in SQL_TASKS_4 for tpl in SQL_TEMPLATES_4]
    code += [tpl.format(t=t) for t in REGEX_TASKS_4 for tpl in REGEX_TEMPLATES_4] + DEV_QUESTIONS_4
    code += [tpl.format(e=e) for e in ERRORS_4 for tpl in ERROR_TEMPLATES_4]
    code += [tpl.format(lang=lang, fence=fence, code=c) for lang, fence, c in BUGGY_CODE_4 for tpl in BUG_TEMPLATES_4]
    code += [tpl.format(c=c) for c in CONCEPTS_4 for tpl in CONCEPT_TEMPLATES_4]
    snippets = [s for s in stdlib_snippets(650, random.Random(2468)) if not _off_topic_4(s.split("\n", 1)[0])]
    code += [tpl.format(s=s) for s in snippets for tpl in rng.sample(SNIPPET_TEMPLATES_4, 2)]
    rng.shuffle(chat)
    rng.shuffle(code)
    return _alternate(chat, code)


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
    mixed += third_prompts(random.Random(seed + 2))
    mixed += fourth_prompts(random.Random(seed + 3))
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
