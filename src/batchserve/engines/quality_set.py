"""The text sets the quality gate measures on, and how they were made.

Theory of operation: :func:`build` makes the set from a seed and the hand-written material
below (topics, each with facts and questions; a few texts of other shapes: other languages,
code, log lines, product titles, numbers), so anyone can regenerate it; the result is
shipped as ``data/quality_set.json`` and :func:`load` reads that file (a test checks the
two agree). The set has:

* ``texts``: at least 1,000 texts from 1 word to about 200, in five shapes: keyword
  queries, questions, single sentences, passages of 2-6 sentences from one topic, and long
  passages of 7-14 sentences (some spanning two topics);
* a retrieval set: ``queries`` (questions and keyword queries) and ``passages`` (each
  fact of each topic, so the five or six of one topic compete as near neighbours),
  queries to be ranked against passages.

Beside them, the gate ranks a set with close neighbours, as an index holds them:
:func:`neighbour_paragraphs`, the paragraphs of Python's own reference manual
(``pydoc_data.topics``, in every CPython install, read by
:mod:`batchserve.engines.corpus`: about 1,450 distinct paragraphs of 8 words or more over
79 topics, so each has many near neighbours on its own topic). They are not shipped with
the package: :func:`~batchserve.engines.gate.default_quality_set` reads them from the
running Python, so their text (and the reference vectors cached for them) follows its
version.

The gate (:mod:`batchserve.engines.quality`) compares an engine's embeddings of every text
with the fp32 reference, checks that each query's nearest passage is unchanged, and that
each paragraph's nearest and ten nearest neighbours are.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from batchserve.errors import ConfigError

__all__ = ["QualitySet", "build", "load", "neighbour_paragraphs", "read", "to_json"]

SEED = 20261130
_FILE = "quality_set.json"

# topic -> (facts, questions)
_TOPICS: dict[str, tuple[list[str], list[str]]] = {
    "coffee": (
        [
            "Arabica beans grow best at high altitude and give a sweeter, more acidic cup.",
            "Robusta has nearly twice the caffeine of arabica and a harsher, earthier taste.",
            "Espresso forces hot water through finely ground coffee at about nine bars.",
            "Cold brew steeps coarse grounds in cold water for twelve to twenty-four hours.",
            "Light roasts keep more of the bean's origin flavour, dark roasts taste of the roast.",
            "A burr grinder gives a more even grind than a blade grinder.",
        ],
        ["how much caffeine is in robusta coffee", "what pressure does an espresso machine use"],
    ),
    "bread": (
        [
            "Sourdough rises with wild yeast and lactic acid bacteria kept in a starter.",
            "Kneading develops gluten, the protein network that traps gas in the dough.",
            "A long cold proof in the fridge deepens the flavour of the loaf.",
            "Steam in the first minutes of baking lets the crust expand before it sets.",
            "Rye flour has little gluten, so rye breads are dense and moist.",
        ],
        ["why does sourdough need a starter", "how to get a crispy crust on bread"],
    ),
    "volcanoes": (
        [
            "Shield volcanoes such as Mauna Loa are built from runny basaltic lava flows.",
            "Stratovolcanoes erupt explosively because their sticky magma traps gas.",
            "A pyroclastic flow is a fast current of hot gas and ash that hugs the ground.",
            "Most volcanoes lie along the boundaries of tectonic plates, like the Ring of Fire.",
            "Volcanic ash can stop jet engines and ground flights over whole continents.",
        ],
        ["what makes a volcano erupt explosively", "where are most volcanoes located"],
    ),
    "photosynthesis": (
        [
            "Plants turn carbon dioxide and water into glucose using the energy of sunlight.",
            "Chlorophyll absorbs red and blue light and reflects green, so leaves look green.",
            "The light reactions take place in the thylakoid membranes of the chloroplast.",
            "The Calvin cycle fixes carbon dioxide into sugar in the stroma.",
            "Oxygen released by photosynthesis comes from splitting water molecules.",
        ],
        ["why are leaves green", "where does the oxygen from photosynthesis come from"],
    ),
    "databases": (
        [
            "An index lets a database find rows without scanning the whole table.",
            "A transaction is atomic: either all of its changes are applied or none are.",
            "Write-ahead logging records a change before applying it, so a crash can be undone.",
            "Normalisation removes duplicated data by splitting it into related tables.",
            "A B-tree keeps keys sorted and balanced so lookups take logarithmic time.",
            "Replication copies data to other servers for availability and read scaling.",
        ],
        ["what does a database index do", "how does write ahead logging help recovery"],
    ),
    "networking": (
        [
            "TCP delivers a reliable ordered byte stream and retransmits lost packets.",
            "UDP sends datagrams without connection set-up, ordering or retransmission.",
            "DNS translates human-readable names into IP addresses.",
            "A load balancer spreads incoming requests across several servers.",
            "TLS encrypts traffic and lets the client verify the server's certificate.",
        ],
        ["difference between tcp and udp", "what does dns do"],
    ),
    "machine learning": (
        [
            "Gradient descent adjusts a model's weights in the direction that lowers the loss.",
            "Overfitting happens when a model memorises the training data and fails on new data.",
            "Dropout randomly disables units during training to reduce overfitting.",
            "A validation set is held out to tune hyperparameters without touching the test set.",
            "Quantization stores weights as 8-bit integers to make inference faster and smaller.",
            "Sentence embeddings map texts to vectors so that similar meanings lie close together.",
        ],
        ["how to prevent overfitting", "what is quantization of a neural network"],
    ),
    "marathon": (
        [
            "A marathon is 42.195 kilometres long, a distance fixed at the 1908 London Olympics.",
            "Runners often hit the wall around the thirtieth kilometre when glycogen runs out.",
            "Tapering means reducing training volume in the weeks before a race.",
            "Easy long runs build the aerobic base that a marathon depends on.",
            "Drinking to thirst is safer than forcing down water at every station.",
        ],
        ["how long is a marathon", "what is tapering before a race"],
    ),
    "chess": (
        [
            "Castling moves the king two squares toward a rook and jumps the rook over it.",
            "En passant lets a pawn capture another that has just advanced two squares beside it.",
            "Controlling the centre early gives pieces more room to move.",
            "A stalemate, when the side to move has no legal move and is not in check, is a draw.",
            "The Sicilian Defence answers 1.e4 with c5 and is the most popular reply.",
        ],
        ["what is en passant in chess", "is stalemate a draw"],
    ),
    "rome": (
        [
            "Rome was founded, according to legend, by Romulus in 753 BC.",
            "The Colosseum could hold about fifty thousand spectators for games and executions.",
            "Julius Caesar was assassinated on the Ides of March in 44 BC.",
            "Roman aqueducts carried water into cities by gravity over long distances.",
            "The Western Roman Empire ended when Romulus Augustulus was deposed in 476 AD.",
        ],
        ["when was julius caesar killed", "how did roman aqueducts work"],
    ),
    "sleep": (
        [
            "Adults need roughly seven to nine hours of sleep a night.",
            "Deep sleep helps the body repair tissue, REM sleep is linked to memory and dreams.",
            "Blue light from screens in the evening can delay the release of melatonin.",
            "Caffeine has a half-life of about five hours, so late coffee can disturb sleep.",
            "A regular wake-up time stabilises the body clock more than a regular bedtime.",
        ],
        ["how many hours of sleep do adults need", "does screen light affect sleep"],
    ),
    "electric cars": (
        [
            "Electric cars convert about three quarters of battery energy into motion.",
            "Regenerative braking recovers energy by running the motor as a generator.",
            "Fast chargers send direct current to the battery, bypassing the car's own charger.",
            "Cold weather reduces range because the battery and cabin need heating.",
            "Lithium iron phosphate batteries last more cycles but store less energy per kilogram.",
        ],
        ["why do electric cars lose range in winter", "what is regenerative braking"],
    ),
    "bees": (
        [
            "Honey bees tell each other where flowers are with a waggle dance.",
            "A colony has one queen, thousands of female workers and a few male drones.",
            "Bees make honey by evaporating water from nectar and adding enzymes.",
            "Pollinators such as bees are needed for about a third of the food crops we eat.",
            "Varroa mites weaken colonies by feeding on bees and spreading viruses.",
        ],
        ["how do bees communicate", "how is honey made"],
    ),
    "git": (
        [
            "A git commit records a snapshot of the tracked files and a pointer to its parent.",
            "Rebasing replays commits onto another base and rewrites their hashes.",
            "A merge commit has two parents and joins two lines of history.",
            "git bisect finds the commit that introduced a bug by binary search.",
            "The staging area holds the changes that the next commit will contain.",
        ],
        ["how to find which commit introduced a bug", "difference between merge and rebase"],
    ),
    "climate": (
        [
            "Carbon dioxide traps heat by absorbing infrared radiation emitted by the surface.",
            "Sea level rises as ocean water warms and expands and as glaciers melt.",
            "The Paris Agreement aims to keep warming well below two degrees Celsius.",
            "Methane is a stronger greenhouse gas than carbon dioxide but lasts a shorter time.",
            "Melting Arctic sea ice lowers the albedo, so the ocean absorbs more sunlight.",
        ],
        ["why does sea level rise", "is methane worse than carbon dioxide"],
    ),
    "guitar": (
        [
            "Standard guitar tuning from the lowest string is E A D G B E.",
            "A capo clamps across the frets to raise the pitch of all strings together.",
            "Barre chords use one finger pressed across several strings.",
            "Nylon strings are softer on the fingers than steel strings.",
            "Practising slowly with a metronome builds clean and even timing.",
        ],
        ["what is standard guitar tuning", "what does a capo do"],
    ),
    "vaccines": (
        [
            "Vaccines train the immune system to recognise a pathogen without causing the disease.",
            "mRNA vaccines instruct cells to make a harmless piece of a viral protein.",
            "Herd immunity protects people who cannot be vaccinated when enough others are.",
            "Booster doses restore immunity that wanes over time.",
            "Edward Jenner used cowpox to protect against smallpox in 1796.",
        ],
        ["how do mrna vaccines work", "what is herd immunity"],
    ),
    "tax": (
        [
            "A progressive income tax takes a larger share of higher incomes.",
            "Value added tax is charged at each stage of production on the value added there.",
            "Deductions lower taxable income, while credits lower the tax owed directly.",
            "Capital gains are taxed when an asset is sold for more than it cost.",
            "Filing late usually adds interest and a penalty to the tax due.",
        ],
        ["difference between a tax deduction and a tax credit", "when are capital gains taxed"],
    ),
    "space": (
        [
            "The International Space Station orbits Earth about every ninety minutes.",
            "Light from the Sun takes about eight minutes to reach Earth.",
            "Mars has the tallest volcano in the solar system, Olympus Mons.",
            "A light year, the distance light travels in a year, is about 9.46 trillion km.",
            "Jupiter's Great Red Spot is a storm larger than Earth that has raged for centuries.",
        ],
        [
            "how long does sunlight take to reach earth",
            "what is the tallest volcano in the solar system",
        ],
    ),
    "gardening": (
        [
            "Tomatoes need at least six hours of direct sun a day to fruit well.",
            "Compost adds organic matter that helps soil hold water and nutrients.",
            "Watering deeply and less often encourages roots to grow down.",
            "Mulch suppresses weeds and keeps the soil cool and moist.",
            "Crop rotation reduces pests and diseases that build up in one bed.",
        ],
        ["how much sun do tomatoes need", "why rotate crops in a vegetable garden"],
    ),
    "python": (
        [
            "Python's global interpreter lock lets only one thread run bytecode at a time.",
            "A generator yields values lazily instead of building the whole list in memory.",
            "Virtual environments keep each project's packages apart.",
            "asyncio runs many coroutines on one thread, switching at each await.",
            "Type hints are not enforced at run time but checkers such as mypy read them.",
        ],
        ["what is the gil in python", "why use a virtual environment"],
    ),
    "whales": (
        [
            "The blue whale is the largest animal known to have lived, up to thirty metres long.",
            "Humpback whales sing long complex songs that change from year to year.",
            "Baleen whales filter krill from the water through plates of keratin.",
            "Sperm whales dive more than a kilometre deep to hunt squid.",
            "Commercial whaling drove many species close to extinction in the twentieth century.",
        ],
        ["what is the largest animal ever", "how do baleen whales eat"],
    ),
    "mortgages": (
        [
            "A fixed-rate mortgage keeps the same interest rate for the whole term.",
            "A variable-rate mortgage follows a benchmark rate and can rise or fall.",
            "The loan-to-value ratio compares the loan with the price of the property.",
            "Paying extra early in the term saves the most interest.",
            "An offset account reduces the interest charged by the balance held in it.",
        ],
        ["fixed or variable rate mortgage", "what is loan to value ratio"],
    ),
    "kubernetes": (
        [
            "A Kubernetes pod is the smallest deployable unit and holds one or more containers.",
            "A Deployment keeps the desired number of pod replicas running.",
            "A Service gives a stable address to a changing set of pods.",
            "Readiness probes keep traffic away from a pod until it can serve.",
            "The horizontal pod autoscaler changes the replica count from observed metrics.",
        ],
        ["what is a kubernetes pod", "what does a readiness probe do"],
    ),
    "tea": (
        [
            "Green tea is steamed or pan-fired soon after picking to stop oxidation.",
            "Black tea is fully oxidised, which darkens the leaves and deepens the flavour.",
            "Water just off the boil suits black tea, cooler water suits green tea.",
            "Matcha is powdered green tea whisked into water rather than steeped.",
            "Oolong is partly oxidised and sits between green and black tea.",
        ],
        ["what temperature for green tea", "what is oolong tea"],
    ),
}

_KEYWORDS = [
    "best espresso grinder",
    "sourdough starter ratio",
    "ring of fire map",
    "chlorophyll absorption spectrum",
    "postgres index types",
    "tls handshake steps",
    "dropout rate",
    "marathon pace chart",
    "sicilian defence lines",
    "colosseum capacity",
    "melatonin blue light",
    "ev fast charging",
    "varroa mite treatment",
    "git rebase interactive",
    "paris agreement targets",
    "capo chart",
    "mrna vaccine",
    "vat rates",
    "iss orbit time",
    "compost bin",
    "python gil removal",
    "blue whale size",
    "mortgage calculator",
    "kubernetes service types",
    "matcha whisk",
]

_OTHER = [
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le serveur regroupe les requêtes qui arrivent ensemble en un seul passage.",
    "¿Dónde está la estación de tren más cercana?",
    "Il caffè espresso si prepara con acqua calda ad alta pressione.",
    "ERROR 2026-11-30T09:14:02Z worker-3 timeout after 250ms (queue depth 512)",
    "GET /v1/embeddings HTTP/1.1 200 4.2ms",
    "def mean(xs): return sum(xs) / len(xs)",
    "SELECT name, count(*) FROM orders GROUP BY name HAVING count(*) > 10;",
    "Stainless steel water bottle, 750 ml, vacuum insulated, leak-proof lid",
    "USB-C charger 65W GaN, two ports, foldable plug",
    "Order #48213 shipped on 12 March, expected delivery 3-5 business days.",
    "Temperature 21.5 C, humidity 48%, pressure 1013 hPa",
    "lol that was amazing!!! 😂🔥",
    "Thanks, see you tomorrow",
    "ok",
    "N/A",
    "3.14159 2.71828 1.41421",
    "https://example.org/docs/getting-started?lang=en",
]

_CONNECTIVES = ["Also,", "In addition,", "On a related note,", "Meanwhile,", "By contrast,"]


@dataclass(frozen=True, slots=True, kw_only=True)
class QualitySet:
    """Texts to compare embeddings on, and a retrieval set.

    Attributes:
        texts: the texts whose embeddings are compared (>= 1,000, varied lengths).
        queries: retrieval queries.
        passages: retrieval passages; each query is ranked against all of them.
        neighbours: paragraphs with close neighbours among themselves; each is ranked
            against all the others (empty: the gate measures no neighbourhoods).
    """

    texts: tuple[str, ...]
    queries: tuple[str, ...]
    passages: tuple[str, ...]
    neighbours: tuple[str, ...] = ()


def _passage(rng: random.Random, topic: str, lo: int, hi: int) -> str:
    facts = _TOPICS[topic][0]
    count = rng.randint(lo, hi)
    if count <= len(facts):
        picked = rng.sample(facts, count)
    else:
        picked = rng.sample(facts, len(facts)) + [
            rng.choice(facts) for _ in range(count - len(facts))
        ]
    return " ".join(picked)


def build(seed: int = SEED) -> QualitySet:
    """Make the set from ``seed`` (the shipped one is ``build(SEED)``)."""
    rng = random.Random(seed)
    topics = list(_TOPICS)
    texts: list[str] = []
    texts += _KEYWORDS + _OTHER
    for topic, (facts, questions) in _TOPICS.items():
        texts += facts + questions
        texts.append(topic)
    # Keyword queries made of 2-5 words of a fact.
    for _ in range(200):
        words = rng.choice(_TOPICS[rng.choice(topics)][0]).rstrip(".").split()
        start = rng.randrange(len(words))
        texts.append(" ".join(words[start : start + rng.randint(2, 5)]).lower())
    # Passages of 2-6 sentences from one topic.
    for _ in range(400):
        texts.append(_passage(rng, rng.choice(topics), 2, 6))
    # Long passages of 7-14 sentences, a third of them spanning two topics.
    for i in range(200):
        first = rng.choice(topics)
        if i % 3 == 0:
            second = rng.choice([t for t in topics if t != first])
            texts.append(
                _passage(rng, first, 4, 7)
                + f" {rng.choice(_CONNECTIVES)} "
                + _passage(rng, second, 3, 7)
            )
        else:
            texts.append(_passage(rng, first, 7, 14))
    queries: list[str] = list(_KEYWORDS)
    passages: list[str] = []
    for _topic, (_facts, questions) in _TOPICS.items():
        queries += questions
    for topic in topics:
        passages += _TOPICS[topic][0]
    return QualitySet(texts=tuple(texts), queries=tuple(queries), passages=tuple(passages))


def to_json(qs: QualitySet) -> str:
    """The file's content for ``qs``."""
    return json.dumps(
        {"seed": SEED, "texts": qs.texts, "queries": qs.queries, "passages": qs.passages},
        ensure_ascii=False,
        indent=0,
    )


#: Paragraphs shorter than this (in words) are left out of the gate's neighbours: the
#: grammar rules and "is equivalent to" lines, which tie with each other.
_MIN_PARAGRAPH_WORDS = 8


def neighbour_paragraphs(*, min_words: int = _MIN_PARAGRAPH_WORDS) -> tuple[str, ...]:
    """The gate's neighbours: the paragraphs of Python's reference manual, the short left out.

    :func:`~batchserve.engines.corpus.reference_paragraphs` (the text the benchmarks and
    ``auto``'s timing read too) less those of fewer than ``min_words`` words: about 1,450
    paragraphs of real technical prose and code on 79 topics, so many close neighbours, as
    in a user's index. The text follows the running Python's version; a Python installed
    without ``pydoc_data`` gives an empty tuple (the gate then ranks no neighbourhoods).
    """
    from batchserve.engines.corpus import reference_paragraphs

    try:
        paragraphs = reference_paragraphs()
    except ImportError:  # a Python stripped of its docs
        return ()
    return tuple(p for p in paragraphs if len(p.split()) >= min_words)


def load() -> QualitySet:
    """The shipped set (``data/quality_set.json`` in this package)."""
    raw = resources.files("batchserve.engines").joinpath("data", _FILE).read_text("utf-8")
    return _parse(json.loads(raw), _FILE)


def read(path: Path) -> QualitySet:
    """A set of one's own: a JSON object like the shipped file, or plain text lines.

    A JSON file has ``texts`` and optionally ``queries``, ``passages`` and ``neighbours``
    (lists of strings); a text file has one text per non-empty line (no retrieval set, no
    neighbours).

    Raises:
        ConfigError: the file holds no text, or a field is not a list of strings.
    """
    raw = Path(path).read_text(encoding="utf-8")
    if raw.lstrip().startswith("{"):
        return _parse(json.loads(raw), str(path))
    texts = tuple(line for line in raw.splitlines() if line.strip())
    if not texts:
        raise ConfigError(f"quality set {path}: texts must be non-empty, got no line")
    return QualitySet(texts=texts, queries=(), passages=())


def _parse(data: dict[str, object], where: str) -> QualitySet:
    fields: dict[str, tuple[str, ...]] = {}
    for key in ("texts", "queries", "passages", "neighbours"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise ConfigError(f"quality set {where}: {key} must be a list of strings")
        fields[key] = tuple(value)
    if not fields["texts"]:
        raise ConfigError(f"quality set {where}: texts must be non-empty, got []")
    return QualitySet(**fields)
