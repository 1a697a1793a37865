"""Shop: an offline look-alike of WebShop (Yao et al., 2022, arXiv 2207.01206).

A synthetic catalog (5 categories x 5 product types, attributes, options, prices, titles,
descriptions, feature bullets) is generated from a seed and indexed with BM25 (the `bm25s`
library) over title + description + features. Pages and actions follow WebShop's text env:
search -> results (10 a page, `next >` / `< prev`) -> item (options, `description`, `features`,
`buy now`) with `back to search`; actions `search[...]` and `click[...]`. Buying ends the
episode with WebShop's reward
    r = r_type * (|U_att & Y_att| + |U_opt & Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1).

Deviations from WebShop (also in docs/envs.md):
- r_type is 1.0 for the goal's product type, 0.5 for another type of the same category, 0.1
  otherwise (WebShop mixes query, category-path and title-noun matches); attributes and options
  match exactly, not fuzzily.
- On the search page `admissible_actions` lists a few concrete queries built from the goal (the
  first is the goal's key phrase); `step` also accepts any other non-empty `search[...]`.
- Invalid actions answer "Nothing happens." (WebShop re-shows the page); no Reviews page;
  selected options are marked "(selected)" on the item page; `anchor` is a page-state key.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rspo_lightning.envs.base import NOTHING_HAPPENS, WORD_PATTERN, TextEnv, normalize_action

# -- the catalogue -------------------------------------------------------------------------------

CATEGORIES: tuple[str, ...] = ("beauty", "food", "fashion", "furniture", "electronics")

# type -> (category, attributes, {option name: values}, (lowest price, highest price)).
# No option value, attribute or type name holds . , ; : ! ? (the tiny tokenizer splits on them).
_TYPE_TABLE: dict[str, tuple[str, str, dict[str, str], tuple[int, int]]] = {
    "shampoo": (
        "beauty",
        "sulfate free|paraben free|cruelty free|natural ingredients|dry hair|hair growth|color treated hair",
        {"scent": "lavender|coconut|tea tree|citrus|unscented", "size": "8 fl oz|12 fl oz|16 fl oz|32 fl oz"},
        (5, 40),
    ),
    "lipstick": (
        "beauty",
        "long lasting|cruelty free|paraben free|matte finish|highly pigmented|easy to apply",
        {"color": "ruby red|nude pink|berry|coral|mauve|plum", "size": "pack of 1|pack of 2|pack of 3"},
        (4, 30),
    ),
    "face moisturizer": (
        "beauty",
        "fragrance free|oil free|sensitive skin|dry skin|hyaluronic acid|anti aging|non greasy",
        {"size": "50 ml|75 ml|100 ml|150 ml"},
        (8, 60),
    ),
    "nail polish": (
        "beauty",
        "long lasting|quick dry|non toxic|cruelty free|chip resistant|high gloss",
        {"color": "classic red|baby pink|midnight blue|clear|black|lilac"},
        (3, 20),
    ),
    "body wash": (
        "beauty",
        "sulfate free|moisturizing|sensitive skin|natural ingredients|dermatologist tested|paraben free",
        {"scent": "lavender|coconut|eucalyptus|vanilla|unscented", "size": "12 fl oz|18 fl oz|32 fl oz"},
        (4, 25),
    ),
    "protein bars": (
        "food",
        "gluten free|high protein|low sugar|non gmo|keto friendly|dairy free|plant based",
        {
            "flavor": "chocolate peanut butter|cookies and cream|vanilla almond|salted caramel|birthday cake",
            "size": "12 count|15 count|24 count",
        },
        (15, 45),
    ),
    "coffee": (
        "food",
        "fair trade|organic|medium roast|dark roast|whole bean|low acid",
        {"flavor": "french vanilla|hazelnut|original|mocha|caramel", "size": "12 ounce|2 pound|5 pound"},
        (8, 60),
    ),
    "popcorn": (
        "food",
        "gluten free|non gmo|low calorie|whole grain|ready to eat|air popped",
        {"flavor": "sea salt|white cheddar|kettle corn|butter|caramel", "size": "pack of 6|pack of 12|pack of 24"},
        (10, 40),
    ),
    "herbal tea": (
        "food",
        "caffeine free|organic|non gmo|individually wrapped|kosher|decaf",
        {"flavor": "chamomile|peppermint|hibiscus|ginger lemon|rooibos", "size": "20 count|40 count|100 count"},
        (4, 30),
    ),
    "beef jerky": (
        "food",
        "high protein|low fat|gluten free|keto friendly|no preservatives|grass fed",
        {"flavor": "original|teriyaki|peppered|sweet and spicy", "size": "3 oz|8 oz|16 oz"},
        (6, 45),
    ),
    "t-shirt": (
        "fashion",
        "machine washable|long sleeve|short sleeve|cotton|slim fit|moisture wicking|relaxed fit",
        {"color": "black|white|navy|heather grey|red|olive green", "size": "small|medium|large|x-large|xx-large"},
        (8, 40),
    ),
    "jeans": (
        "fashion",
        "machine washable|slim fit|straight leg|high waist|stretch denim|button closure|relaxed fit",
        {
            "color": "dark wash|light wash|black|medium blue",
            "size": "28w x 30l|30w x 32l|32w x 32l|34w x 32l|36w x 34l",
        },
        (20, 80),
    ),
    "running shoes": (
        "fashion",
        "non slip|rubber sole|lightweight|breathable mesh|arch support|lace up",
        {"color": "black|white|grey|navy|pink", "size": "7|8|9|10|11|12"},
        (30, 120),
    ),
    "dress": (
        "fashion",
        "machine washable|short sleeve|v neck|elastic waist|pockets|knee length|floral print",
        {"color": "black|navy|red|floral blue|green", "size": "x-small|small|medium|large|x-large"},
        (15, 70),
    ),
    "hoodie": (
        "fashion",
        "machine washable|fleece lined|pullover|zip up|drawstring|kangaroo pocket|long sleeve",
        {"color": "black|grey|navy|burgundy|forest green", "size": "small|medium|large|x-large|xx-large"},
        (18, 60),
    ),
    "office chair": (
        "furniture",
        "ergonomic design|lumbar support|adjustable height|easy assembly|mesh back|360 swivel",
        {"color": "black|grey|white|blue"},
        (50, 300),
    ),
    "bookshelf": (
        "furniture",
        "easy assembly|engineered wood|5 tier|space saving|living room|solid wood",
        {"color": "espresso|white|walnut|black oak"},
        (30, 200),
    ),
    "coffee table": (
        "furniture",
        "easy assembly|living room|storage space|solid wood|lift top|mid century",
        {"color": "walnut|white|black|natural"},
        (40, 250),
    ),
    "bed frame": (
        "furniture",
        "easy assembly|no box spring needed|metal frame|under bed storage|noise free|upholstered",
        {"color": "black|grey|white", "size": "twin|full|queen|king"},
        (80, 400),
    ),
    "throw pillow covers": (
        "furniture",
        "machine washable|hidden zipper|living room|soft velvet|double sided|set of 2",
        {"color": "beige|navy|mustard yellow|grey|blush pink", "size": "18 x 18 inch|20 x 20 inch|22 x 22 inch"},
        (8, 30),
    ),
    "wireless earbuds": (
        "electronics",
        "noise cancelling|bluetooth 5|long battery life|water resistant|fast charging|touch control",
        {"color": "black|white|blue"},
        (15, 150),
    ),
    "phone case": (
        "electronics",
        "shockproof|wireless charging compatible|slim fit|drop protection|kickstand|clear back",
        {"color": "black|clear|navy|red|pink", "model": "iphone 13|iphone 14|galaxy s22|galaxy s23|pixel 7"},
        (5, 30),
    ),
    "hdmi cable": (
        "electronics",
        "high speed|4k|gold plated|braided|ethernet|long cable",
        {"size": "3 feet|6 feet|10 feet|15 feet"},
        (5, 25),
    ),
    "power bank": (
        "electronics",
        "fast charging|usb c|portable|high capacity|led display|wireless charging",
        {"color": "black|white|blue", "size": "10000mah|20000mah|26800mah"},
        (15, 70),
    ),
    "bluetooth speaker": (
        "electronics",
        "waterproof|portable|long battery life|bass boost|bluetooth 5|built in microphone",
        {"color": "black|blue|red|camo"},
        (20, 150),
    ),
}
PRODUCT_TYPES: tuple[str, ...] = tuple(_TYPE_TABLE)
assert {row[0] for row in _TYPE_TABLE.values()} == set(CATEGORIES), "every category needs product types"

_BRANDS = (
    "Lumora",
    "Vexon",
    "Kestrel",
    "Orlo",
    "Brightfield",
    "Northpeak",
    "Solvie",
    "Tamber",
    "Quill and Co",
    "Maplewood",
    "Zentro",
    "Halcyon",
    "Rivo",
    "Ember Lane",
    "Coastline",
    "Pinecrest",
    "Nuvola",
    "Arden",
    "Foxglove",
    "Ironbark",
)
_TITLE_SUFFIX = {
    "beauty": ("", "for Women", "for Men", "Salon Quality"),
    "food": ("", "Snack Pack", "Family Size", "Gourmet"),
    "fashion": ("", "for Men", "for Women", "Unisex"),
    "furniture": ("", "for Home", "Modern", "Classic"),
    "electronics": ("", "with Warranty", "2023 Upgraded", "Pro"),
}
_DESCRIPTION_TAIL = {
    "beauty": ("Gentle enough for daily use.", "Made in small batches and tested with care."),
    "food": ("Great for lunch boxes, offices and road trips.", "Packed fresh and sealed for flavor."),
    "fashion": ("Comfortable enough to wear all day.", "A wardrobe staple that pairs with anything."),
    "furniture": ("Adds warmth and style to any space.", "Sturdy build with a clean modern look."),
    "electronics": ("Works with most modern devices.", "Backed by friendly customer support."),
}
_BULLETS = ("{a} for everyday use", "{a} you can count on", "{a} with a quality guarantee")
_GENERIC_BULLETS = (
    "Satisfaction guaranteed or your money back",
    "Ships in recyclable packaging",
    "Loved by thousands of customers",
)
#: Goal price limits: the smallest bucket above the target's price (or the one after).
PRICE_BUCKETS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 120, 140, 160, 180, 200, 250, 300, 350, 400, 450, 500)
# Product -> split by a hash of its asin: hash % 10 == 0 test, == 1 valid, else train.
_SPLIT_OF_BUCKET = {0: "test", 1: "valid"}
_STOPWORDS = frozenset("a an and for i in of or the to with need".split())
_TOKEN_RE = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Product:
    """One catalog item. `asin` is WebShop-style ("B0" + 8 characters), shown in upper case."""

    asin: str
    product_type: str
    category: str
    title: str
    #: The attributes the product has (a subset of its type's), in the type's order.
    attributes: tuple[str, ...]
    #: (option name, offered values) for each option of the type, in the type's order.
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: float
    description: str
    features: tuple[str, ...]


@dataclass(frozen=True)
class ShopGoal:
    """One task: the instruction and the structured goal it was rendered from."""

    instruction: str
    product_type: str
    category: str
    #: U_att: the attributes asked for.
    attributes: tuple[str, ...]
    #: U_opt: (option name, value) pairs asked for.
    options: tuple[tuple[str, str], ...]
    #: u_price: the price limit in dollars.
    price_upper: float
    #: asin of the product the goal was generated from (buying it with the options wins).
    target: str
    #: Search candidates offered on the search page; the first is the goal's key phrase.
    queries: tuple[str, ...]


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _hash_split(*parts: object) -> str:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return _SPLIT_OF_BUCKET.get(int.from_bytes(digest[:8], "big") % 10, "train")


def search_tokens(text: str) -> list[str]:
    """BM25 terms of `text`: lower-case alphanumeric runs without a few stop words."""
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _make_product(rng: random.Random, asin: str, product_type: str) -> Product:
    category, attribute_text, option_table, (low, high) = _TYPE_TABLE[product_type]
    pool = attribute_text.split("|")
    chosen = set(rng.sample(pool, rng.randint(2, min(4, len(pool)))))
    attributes = tuple(a for a in pool if a in chosen)
    options = []
    for name, values_text in option_table.items():
        values = values_text.split("|")
        offered = set(rng.sample(values, rng.randint(2, min(4, len(values)))))
        options.append((name, tuple(v for v in values if v in offered)))
    brand = rng.choice(_BRANDS)
    in_title = rng.sample(attributes, rng.randint(1, 2))
    title = " ".join(
        [brand, *(a.title() for a in in_title), product_type.title(), rng.choice(_TITLE_SUFFIX[category])]
    ).strip()
    description = (
        f"This {product_type} from {brand} is {_and_list(list(attributes))}. {rng.choice(_DESCRIPTION_TAIL[category])}"
    )
    features = tuple(rng.choice(_BULLETS).format(a=a.capitalize()) for a in attributes) + (
        rng.choice(_GENERIC_BULLETS),
    )
    price = round(rng.uniform(low, high), 2)
    return Product(asin, product_type, category, title, attributes, tuple(options), price, description, features)


class Catalog:
    """The products of one seed and their BM25 index (title + description + features).

    Shared between envs of the same `(seed, num_products)` through `get_catalog`; read-only.
    """

    def __init__(self, seed: int, num_products: int) -> None:
        import bm25s  # the search library (WebShop uses Lucene's BM25 through pyserini)

        rng = _rng("shop-catalog", seed)
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        asins: list[str] = []
        while len(asins) < num_products:
            asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
            if asin not in asins:
                asins.append(asin)
        types = [PRODUCT_TYPES[i % len(PRODUCT_TYPES)] for i in range(num_products)]
        rng.shuffle(types)
        self.products: tuple[Product, ...] = tuple(_make_product(rng, a, t) for a, t in zip(asins, types))
        self.index_of: dict[str, int] = {p.asin: i for i, p in enumerate(self.products)}
        self.split_of: tuple[str, ...] = tuple(_hash_split("shop-product", seed, p.asin) for p in self.products)
        corpus = [search_tokens(" ".join([p.title, p.description, *p.features])) for p in self.products]
        self._bm25 = bm25s.BM25()
        self._bm25.index(corpus, show_progress=False)
        self._cache: dict[str, tuple[int, ...]] = {}

    def search(self, query: str) -> tuple[int, ...]:
        """Indices of the products with a positive BM25 score for `query`, best first (ties by index)."""
        hit = self._cache.get(query)
        if hit is None:
            terms = search_tokens(query)
            if not terms:
                hit = ()
            else:
                scores = np.asarray(self._bm25.get_scores(terms))
                order = np.argsort(-scores, kind="stable")
                hit = tuple(int(i) for i in order if scores[i] > 0)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[query] = hit
        return hit


@functools.lru_cache(maxsize=8)
def get_catalog(seed: int, num_products: int) -> Catalog:
    """The catalog of `(seed, num_products)`, built once per process."""
    return Catalog(seed, num_products)


# -- the reward --------------------------------------------------------------------------------


def type_reward(goal: ShopGoal, product: Product) -> float:
    """r_type: 1.0 same product type, 0.5 same category, 0.1 otherwise (simplified WebShop gate)."""
    if product.product_type == goal.product_type:
        return 1.0
    return 0.5 if product.category == goal.category else 0.1


def purchase_reward(goal: ShopGoal, product: Product, selected: Mapping[str, str]) -> float:
    """WebShop's reward for buying `product` with the options `selected` ({name: value}).

    r = r_type * (|U_att & Y_att| + |U_opt & Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1),
    with Y_att the product's attributes and Y_opt the selected values.
    """
    attributes = len(set(goal.attributes) & set(product.attributes))
    options = len({v for _, v in goal.options} & set(selected.values()))
    price = 1 if product.price <= goal.price_upper else 0
    total = len(goal.attributes) + len(goal.options) + 1
    return type_reward(goal, product) * (attributes + options + price) / total


def _offers(product: Product, product_type: str, attributes, options) -> bool:
    """Whether `product` is of `product_type`, has `attributes` and offers the (name, value) `options`."""
    offered = {(n, v) for n, values in product.options for v in values}
    return (
        product.product_type == product_type and set(attributes) <= set(product.attributes) and set(options) <= offered
    )


def is_perfect(goal: ShopGoal, product: Product) -> bool:
    """Whether buying `product` with the right options earns reward 1."""
    return _offers(product, goal.product_type, goal.attributes, goal.options) and product.price <= goal.price_upper


# -- goals -------------------------------------------------------------------------------------


def _render_goal(
    product: Product, attributes: list[str], options: list[tuple[str, str]], price_upper: float
) -> ShopGoal:
    option_text = " and ".join(f"{v} {n}" for n, v in options)
    article = "an" if attributes[0][0] in "aeiou" else "a"
    instruction = (
        f"i need {article} {_and_list(attributes)} {product.product_type} in {option_text}, "
        f"price lower than {price_upper:.2f} dollars"
    )
    values = [v for _, v in options]
    queries = (
        " ".join([*attributes, product.product_type, *values]),
        " ".join([*attributes, product.product_type]),
        " ".join([product.product_type, *values]),
        product.product_type,
    )
    return ShopGoal(
        instruction,
        product.product_type,
        product.category,
        tuple(attributes),
        tuple(options),
        float(price_upper),
        product.asin,
        tuple(dict.fromkeys(queries)),
    )


def generate_goal(
    catalog: Catalog, seed: int, split: str, task_id: int, num_results: int, results_per_page: int, max_steps: int
) -> ShopGoal:
    """Build the goal `(seed, split, task_id)`; pure and stable across Python runs.

    Draws a target product of `split` (products are split by a hash of their asin), 1-3 of its
    attributes, one offered value per option and a price limit above its price. A draw is kept
    only if (a) its goal key (type, attributes, options) is owned by `split`: the first catalog
    product that has those attributes and offers those options is a `split` product, so no target
    product and no goal key is shared between splits; and (b) a reward-1 product ranks, for the
    first search candidate, within the `num_results` results at a page the expert reaches within
    `max_steps`.
    """
    rng = _rng("shop", seed, split, task_id)
    pool = [i for i, s in enumerate(catalog.split_of) if s == split]
    if not pool:
        raise ValueError(
            f"the catalog of {len(catalog.products)} products has no {split} products; use more num_products"
        )
    for _ in range(10000):
        product = catalog.products[rng.choice(pool)]
        picked = set(rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes)))))
        attributes = [a for a in product.attributes if a in picked]
        options = [(name, rng.choice(values)) for name, values in product.options]
        # The goal key belongs to the split of the first catalog product that could satisfy it.
        owner = next(i for i, q in enumerate(catalog.products) if _offers(q, product.product_type, attributes, options))
        if catalog.split_of[owner] != split:
            continue
        higher = [b for b in PRICE_BUCKETS if b > product.price]
        price_upper = higher[min(len(higher) - 1, rng.randint(0, 1))]
        goal = _render_goal(product, attributes, options, price_upper)
        results = catalog.search(goal.queries[0])[:num_results]
        rank = next((r for r, i in enumerate(results) if is_perfect(goal, catalog.products[i])), None)
        # search + pages + click + one click per option + buy
        if rank is not None and 3 + rank // results_per_page + len(options) <= max_steps:
            return goal
    raise RuntimeError(f"no solvable {split} goal for task {task_id}; use more num_products or max_steps")


# -- the environment ---------------------------------------------------------------------------

_SEARCH_RE = re.compile(r"search\[(.*)\]", re.DOTALL)
_SEP = " [SEP] "


@dataclass(frozen=True)
class _Page:
    kind: str
    query: str = ""
    page: int = 1
    product: int = -1  # catalog index on item / description / features pages


class Shop(TextEnv):
    """Offline WebShop look-alike: synthetic catalog, BM25 search, WebShop pages and reward.

    Args:
        num_products: Products in the catalog (at least 50, so every split has targets).
        num_results: Search results kept per query (WebShop: 50).
        results_per_page: Results shown on one results page (WebShop: 10).
        max_steps: Steps (valid or not) before the episode is truncated (verl-agent: 15).
        reward_scale: The step reward of `buy now` is reward_scale * r, r the WebShop reward in
            [0, 1] (so an exact buy gives 10, like Household's success_reward).
        seed: Catalog and task seed; tasks are a function of (seed, split, task_id).
        num_train_tasks: Tasks in the train split.
        num_valid_tasks: Tasks in the valid split.
        num_test_tasks: Tasks in the test split (WebShop: 500).
        render_mode: None or "ansi".
    """

    splits = ("train", "valid", "test")

    def __init__(
        self,
        num_products: int = 300,
        num_results: int = 50,
        results_per_page: int = 10,
        max_steps: int = 15,
        reward_scale: float = 10.0,
        seed: int = 0,
        num_train_tasks: int = 10000,
        num_valid_tasks: int = 1000,
        num_test_tasks: int = 500,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        for name, value, low in (
            ("num_products", num_products, 50),
            ("num_results", num_results, 1),
            ("results_per_page", results_per_page, 1),
            ("max_steps", max_steps, 5),
            ("num_train_tasks", num_train_tasks, 1),
            ("num_valid_tasks", num_valid_tasks, 1),
            ("num_test_tasks", num_test_tasks, 1),
        ):
            if int(value) < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if float(reward_scale) <= 0:
            raise ValueError(f"reward_scale must be > 0, got {reward_scale}")
        self.num_products = int(num_products)
        self.num_results = int(num_results)
        self.results_per_page = int(results_per_page)
        self.max_steps = int(max_steps)
        self.reward_scale = float(reward_scale)
        self.seed = int(seed)
        self._num_tasks = {"train": int(num_train_tasks), "valid": int(num_valid_tasks), "test": int(num_test_tasks)}
        self.catalog = get_catalog(self.seed, self.num_products)
        # A fresh env holds train task 0 as a finished episode: step() before reset() is invalid.
        self._load("train", 0)
        self._done = True

    # -- TextEnv contract -----------------------------------------------------------------------

    def num_tasks(self, split: str) -> int:
        return self._num_tasks[self.check_split(split)]

    def task(self, split: str, task_id: int) -> ShopGoal:
        """The goal `(split, task_id)` under this env's settings (does not change the state)."""
        split = self.check_split(split)
        task_id = self.check_task_id(split, task_id)
        return generate_goal(
            self.catalog, self.seed, split, task_id, self.num_results, self.results_per_page, self.max_steps
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start task `options["task_id"]` of `options["split"]` (default "train") on the search page.

        Without a task_id, one is drawn from the env's rng (seeded by `seed`).
        """
        super().reset(seed=seed)
        split, task_id = self.task_from_options(options)
        self._load(split, task_id)
        return self._observe(self._render()), self._info(False)

    def step(self, action: Any):
        norm = normalize_action(action)
        if norm is None or self._done:
            return self._invalid()
        command = self._admissible.get(norm)
        if command is None and self._page.kind == "search":
            match = _SEARCH_RE.fullmatch(norm)
            if match and match.group(1).strip():  # any free-text query is a legal search
                command = ("search", match.group(1).strip())
        if command is None:
            return self._invalid()
        self._steps += 1
        reward = 0.0
        kind = command[0]
        if kind == "buy":
            product = self.catalog.products[self._page.product]
            self._score = purchase_reward(self._task, product, self._selected)
            self._won = self._score == 1.0
            self._bought = product.asin
            reward = self.reward_scale * self._score
        elif kind == "option":
            self._selected[command[1]] = command[2]
        else:
            if kind == "product":
                self._selected = {}
            self._page = command[1] if kind == "goto" else self._new_page(command)
        terminated = self._bought is not None
        self._truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or self._truncated
        self._admissible = {} if self._done else self._compute_admissible()
        if terminated:
            observation = f"Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {self._score:.2f}"
        else:
            observation = self._render()
        return self._observe(observation), reward, terminated, self._truncated, self._info(False)

    def _new_page(self, command: tuple) -> _Page:
        if command[0] == "search":
            return _Page("results", command[1], 1)
        return _Page("item", self._page.query, self._page.page, command[1])  # "product"

    def _terminated(self) -> bool:
        return self._bought is not None

    def _info(self, invalid: bool) -> dict[str, Any]:
        return {
            "task": self._task.instruction,
            "task_type": self._task.category,
            "admissible_actions": list(self._admissible),
            "anchor": self._anchor(),
            "privileged": self._privileged(),
            "won": self._won,
            "score": self._score,
            "progress": self._progress(),
            "invalid": invalid,
        }

    # -- state ----------------------------------------------------------------------------------

    def _load(self, split: str, task_id: int) -> None:
        self._task = self.task(split, task_id)
        self._split, self._task_id = split, task_id
        self._page = _Page("search")
        self._selected: dict[str, str] = {}  # option name -> value on the current item
        self._steps = 0
        self._score = 0.0
        self._bought: str | None = None
        self._won = self._truncated = self._done = False
        self._admissible = self._compute_admissible()

    def _results(self, query: str) -> tuple[int, ...]:
        return self.catalog.search(query)[: self.num_results]

    def _num_pages(self, query: str) -> int:
        return max(1, -(-len(self._results(query)) // self.results_per_page))

    def _page_results(self) -> tuple[int, ...]:
        start = (self._page.page - 1) * self.results_per_page
        return self._results(self._page.query)[start : start + self.results_per_page]

    def _compute_admissible(self) -> dict[str, tuple]:
        """Normalised action -> command, in the order the page shows the clickables."""
        page = self._page
        if page.kind == "search":
            return {f"search[{q}]": ("search", q) for q in self._task.queries}
        commands: dict[str, tuple] = {"click[back to search]": ("goto", _Page("search"))}
        if page.kind == "results":
            if page.page > 1:
                commands["click[< prev]"] = ("goto", _Page("results", page.query, page.page - 1))
            if page.page < self._num_pages(page.query):
                commands["click[next >]"] = ("goto", _Page("results", page.query, page.page + 1))
            for i in self._page_results():
                commands[f"click[{self.catalog.products[i].asin.lower()}]"] = ("product", i)
        elif page.kind == "item":
            commands["click[< prev]"] = ("goto", _Page("results", page.query, page.page))
            for name, values in self.catalog.products[page.product].options:
                for value in values:
                    commands[f"click[{value}]"] = ("option", name, value)
            commands["click[description]"] = ("goto", _Page("description", page.query, page.page, page.product))
            commands["click[features]"] = ("goto", _Page("features", page.query, page.page, page.product))
            commands["click[buy now]"] = ("buy",)
        else:  # description / features
            commands["click[< prev]"] = ("goto", _Page("item", page.query, page.page, page.product))
        return commands

    def _render(self) -> str:
        """The page in WebShop's text-env layout: clickables and texts joined by " [SEP] "."""
        page, head = self._page, ["Instruction:", self._task.instruction]
        if page.kind == "search":
            return _SEP.join(["WebShop", *head, "Search"])
        head.append("Back to Search")
        if page.kind == "results":
            parts = [*head, f"Page {page.page} (Total results: {len(self._results(page.query))})"]
            if page.page > 1:
                parts.append("< Prev")
            if page.page < self._num_pages(page.query):
                parts.append("Next >")
            for i in self._page_results():
                p = self.catalog.products[i]
                parts += [p.asin, p.title, f"${p.price:.2f}"]
            return _SEP.join(parts)
        product = self.catalog.products[page.product]
        parts = [*head, "< Prev"]
        if page.kind == "item":
            for name, values in product.options:
                parts.append(name)
                parts += [f"{v} (selected)" if self._selected.get(name) == v else v for v in values]
            parts += [
                product.title,
                f"Price: ${product.price:.2f}",
                "Rating: N.A.",
                "Description",
                "Features",
                "Buy Now",
            ]
        elif page.kind == "description":
            parts.append(product.description)
        else:
            parts += list(product.features)
        return _SEP.join(parts)

    # -- progress, anchor, privileged text ------------------------------------------------------

    def _progress(self) -> float:
        """(results hold a reward-1 product + viewing one + fraction of goal options selected on
        it) / 4 in the current state; 1.0 once won. A losing purchase keeps the value it had."""
        if self._won:
            return 1.0
        page, goal = self._page, self._task
        if page.kind == "search":
            return 0.0
        found = any(is_perfect(goal, self.catalog.products[i]) for i in self._results(page.query))
        if page.kind == "results" or not is_perfect(goal, self.catalog.products[page.product]):
            return found / 4
        chosen = sum(self._selected.get(n) == v for n, v in goal.options) / len(goal.options)
        return (found + 1 + chosen) / 4

    def _anchor(self) -> str:
        """Page-state key: page kind, query, results page, product and selected options."""
        page = self._page
        if self._bought is not None:
            return f"page=done|bought={self._bought}|selected={self._selected_text()}"
        if page.kind == "search":
            return "page=search"
        key = f"page={page.kind}|query={page.query}|p={page.page}"
        if page.kind != "results":
            key += f"|product={self.catalog.products[page.product].asin}|selected={self._selected_text()}"
        return key

    def _selected_text(self) -> str:
        return ",".join(f"{n}={v}" for n, v in sorted(self._selected.items()))

    def _privileged(self) -> str:
        """Full state: the goal, the target product, reward-1 products in the current results
        and their ranks, and what buying the viewed product now would score."""
        goal, products = self._task, self.catalog.products
        target = products[self.catalog.index_of[goal.target]]
        lines = [
            f"Task: {goal.instruction}",
            f"Goal: type {goal.product_type}; attributes {', '.join(goal.attributes)}; "
            f"options {', '.join(f'{n} {v}' for n, v in goal.options)}; price <= {goal.price_upper:.2f}",
            f"Target {target.asin}: {target.title}; attributes {', '.join(target.attributes)}; "
            f"price {target.price:.2f}",
            f"Page: {self._page.kind}"
            + (f"; query {self._page.query}; page {self._page.page}" if self._page.kind != "search" else ""),
        ]
        if self._page.kind != "search":
            ranks = [
                f"{products[i].asin} (rank {r + 1})"
                for r, i in enumerate(self._results(self._page.query))
                if is_perfect(goal, products[i])
            ]
            lines.append(f"Matching products in these results: {', '.join(ranks) or 'none'}")
        if self._page.kind in ("item", "description", "features"):
            viewed = products[self._page.product]
            lines.append(
                f"Viewing {viewed.asin}: type {viewed.product_type}; attributes "
                f"{', '.join(viewed.attributes)}; selected {self._selected_text() or 'nothing'}; "
                f"reward if bought now {purchase_reward(goal, viewed, self._selected):.2f}"
            )
        return "\n".join(lines)

    # -- expert ---------------------------------------------------------------------------------

    def expert_action(self) -> str:
        """Next action of the expert: search the key phrase, page to the first reward-1 product,
        open it, select the goal options, buy. From any other page it goes back the shortest way."""
        if self._done:
            return "click[back to search]"
        page, goal, products = self._page, self._task, self.catalog.products
        if page.kind == "search":
            return f"search[{goal.queries[0]}]"
        if page.kind in ("description", "features"):
            return "click[< prev]"
        if page.kind == "item":
            if not is_perfect(goal, products[page.product]):
                return "click[< prev]"
            missing = [v for n, v in goal.options if self._selected.get(n) != v]
            return f"click[{missing[0]}]" if missing else "click[buy now]"
        results = self._results(page.query)
        rank = next((r for r, i in enumerate(results) if is_perfect(goal, products[i])), None)
        if rank is None:
            return "click[back to search]"
        wanted = rank // self.results_per_page + 1
        if wanted == page.page:
            return f"click[{products[results[rank]].asin.lower()}]"
        return "click[next >]" if wanted > page.page else "click[< prev]"

    # -- vocabulary -----------------------------------------------------------------------------

    def vocabulary(self) -> list[str]:
        """Every word the env can print in an observation or admissible action, sorted.

        Holds both `WORD_PATTERN` words and whitespace-separated chunks ("click[b0abc12345]",
        "search[gluten"), so a word-level tokenizer splitting either way covers the env.
        """
        texts = [
            "WebShop Instruction: Search Back to Search < Prev Next > Price: Rating: N.A. "
            "Description Features Buy Now (selected) Page (Total results: [SEP]",
            "Thank you for shopping with us! Your score (min 0.0, max 1.0)",
            NOTHING_HAPPENS,
            "i need a an in and, price lower than dollars",
            "click[back to search] click[< prev] click[next >] click[description] click[features] click[buy now]",
        ]
        texts += [f"{s / 100:.2f}" for s in range(0, 101)]  # scores
        texts += [str(n) for n in range(self.num_results + 1)]
        texts += [f"{n})" for n in range(self.num_results + 1)]
        texts += [f"{b:.2f}" for b in PRICE_BUCKETS]
        for p in self.catalog.products:
            texts += [p.asin, f"click[{p.asin.lower()}]", p.title, f"${p.price:.2f}", p.description, *p.features]
        for product_type, (_, attribute_text, option_table, _) in _TYPE_TABLE.items():
            phrases = [product_type, *attribute_text.split("|")]
            values = [v for vs in option_table.values() for v in vs.split("|")]
            texts += [
                *option_table,
                *(f"{n}," for n in option_table),
                *phrases,
                *values,
                *(f"click[{v}]" for v in values),
            ]
            for phrase in phrases + values:  # the first and last chunk of any search candidate
                texts += [f"search[{phrase}", f"{phrase}]", f"search[{phrase}]", f"{phrase},"]
        words: set[str] = set()
        for text in texts:
            words.update(WORD_PATTERN.findall(text))
            words.update(text.split())
        return sorted(words)
