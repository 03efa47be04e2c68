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
