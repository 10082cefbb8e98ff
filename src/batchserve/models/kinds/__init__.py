"""What a model does, named once: its kind, one value per kind, each in its own module.

A served model is one of five kinds (:class:`Kind`):

* :data:`EMBEDDING` (:mod:`.embedding`): a text in, a float vector out (a
  sentence-transformers folder, the built-in MiniLM, a synthetic model with a dimension);
* :data:`RERANKER` (:mod:`.reranker`): a (query, passage) pair in, one relevance logit out:
  a sequence classification model with one label (what ``CrossEncoder.save`` or a
  ``...ForSequenceClassification.save_pretrained`` with ``num_labels=1`` writes);
* :data:`CLASSIFIER` (:mod:`.classifier`): a text (or a pair) in, one logit per label out:
  a sequence classification model with several labels, named by its ``id2label``;
* :data:`SPARSE` (:mod:`.sparse`): a text in, one weight per vocabulary term out (a
  SPLADE ``SparseEncoder`` folder, or a masked-LM folder served with ``--pooling splade``);
* :data:`MULTIVECTOR` (:mod:`.multivector`): a text in, one vector per kept token out (a
  ColBERT folder as PyLate saves it), scored by MaxSim where it reranks;
* :data:`GENERIC` (:mod:`.generic`): anything else (an imported batch function).

Each kind owns what it means (:mod:`.kind`): its item, its head, its activation
(:mod:`.activation`, the one sigmoid and softmax), its warm-up item, its routes and tasks,
its gate. The protocols, the registry and the operations views read those fields and name
no kind; a new kind is a module here, its line in :mod:`.catalogue`, the parsers of the
tasks it answers, and a test.

:data:`ROUTES` names, per kind, the route a client should use: a route asked of the wrong
kind answers 400 with :func:`wrong_kind`'s message.

:func:`item_of` names what one of a kind's items is, the unit every count of items and
every rate of the operations views (``/status``, ``/metrics``, the dashboard, ``top``,
Triton's configuration and statistics) is in: a reranker's item is a ``pair`` (one query
and one passage: a request of one query and N passages is N items); an embedder's and a
classifier's a ``text``.

:func:`folder_kind` reads the kind of a folder from its files (:mod:`.folder`), and refuses
what batchserve does not serve; :mod:`.prompts` reads an embedder's named prompts and
prepends them.
"""

from batchserve.models.kinds.activation import ACTIVATIONS, NONE, SIGMOID, SOFTMAX, Activation
from batchserve.models.kinds.catalogue import (
    BY_NAME,
    ITEMS,
    KINDS,
    ROUTES,
    item_of,
    kind_named,
    wrong_kind,
)
from batchserve.models.kinds.classifier import CLASSIFIER
from batchserve.models.kinds.embedding import EMBEDDING
from batchserve.models.kinds.folder import SERVES, SPLADE, FolderKind, folder_kind, splade_kind
from batchserve.models.kinds.generic import GENERIC
from batchserve.models.kinds.kind import (
    WARMUP_TEXT,
    GateName,
    Head,
    Kind,
    KindName,
    Logits,
    Sparse,
    Tensors,
    Tokens,
    Unit,
    Vector,
)
from batchserve.models.kinds.multivector import MULTIVECTOR, Marked, maxsim, unpack
from batchserve.models.kinds.prompts import (
    PromptedText,
    Prompts,
    apply_prompt,
    folder_prompts,
    prompt_of,
)
from batchserve.models.kinds.reranker import RERANKER
from batchserve.models.kinds.sparse import SPARSE

__all__ = [
    "ACTIVATIONS",
    "BY_NAME",
    "CLASSIFIER",
    "EMBEDDING",
    "GENERIC",
    "ITEMS",
    "KINDS",
    "MULTIVECTOR",
    "NONE",
    "RERANKER",
    "ROUTES",
    "SERVES",
    "SIGMOID",
    "SOFTMAX",
    "SPARSE",
    "SPLADE",
    "WARMUP_TEXT",
    "Activation",
    "FolderKind",
    "GateName",
    "Head",
    "Kind",
    "KindName",
    "Logits",
    "Marked",
    "PromptedText",
    "Prompts",
    "Sparse",
    "Tensors",
    "Tokens",
    "Unit",
    "Vector",
    "apply_prompt",
    "folder_kind",
    "folder_prompts",
    "item_of",
    "kind_named",
    "maxsim",
    "prompt_of",
    "splade_kind",
    "unpack",
    "wrong_kind",
]
