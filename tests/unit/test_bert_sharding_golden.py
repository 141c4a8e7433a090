"""Golden table: where every BERT parameter and its optimizer state live on a 2x4 mesh.

Columns: shape, parameter PartitionSpec, update/optimizer-state PartitionSpec (WUS).
A change here is a change of the model's parallelism layout: review it as such.
"""

from __future__ import annotations

import jax
from conftest import small_bert_config
from jax.sharding import PartitionSpec

from mlperf.trainer import build_trainer

DM = ("data", "model")
GOLDEN = {
    "embedding_norm/bias": ((32,), (None,), ("data",)),
    "embedding_norm/scale": ((32,), (None,), ("data",)),
    "layers/0/attention/key/bias": ((4, 8), ("model", None), ("model", "data")),
    "layers/0/attention/key/kernel": ((32, 4, 8), (None, "model", None), ("data", "model", None)),
    "layers/0/attention/out/bias": ((32,), (None,), ("data",)),
    "layers/0/attention/out/kernel": ((4, 8, 32), ("model", None, None), ("model", "data", None)),
    "layers/0/attention/query/bias": ((4, 8), ("model", None), ("model", "data")),
    "layers/0/attention/query/kernel": ((32, 4, 8), (None, "model", None), ("data", "model", None)),
    "layers/0/attention/value/bias": ((4, 8), ("model", None), ("model", "data")),
    "layers/0/attention/value/kernel": ((32, 4, 8), (None, "model", None), ("data", "model", None)),
    "layers/0/attention_norm/bias": ((32,), (None,), ("data",)),
    "layers/0/attention_norm/scale": ((32,), (None,), ("data",)),
    "layers/0/mlp/wi/bias": ((64,), ("model",), (DM,)),
    "layers/0/mlp/wi/kernel": ((32, 64), (None, "model"), ("data", "model")),
    "layers/0/mlp/wo/bias": ((32,), (None,), ("data",)),
    "layers/0/mlp/wo/kernel": ((64, 32), ("model", None), ("model", "data")),
    "layers/0/mlp_norm/bias": ((32,), (None,), ("data",)),
    "layers/0/mlp_norm/scale": ((32,), (None,), ("data",)),
    "mlm_bias": ((96,), ("model",), (DM,)),
    "mlm_norm/bias": ((32,), (None,), ("data",)),
    "mlm_norm/scale": ((32,), (None,), ("data",)),
    "mlm_transform/bias": ((32,), (None,), ("data",)),
    "mlm_transform/kernel": ((32, 32), (None, None), ("data", None)),
    "nsp/bias": ((2,), (None,), ("data",)),
    "nsp/kernel": ((32, 2), (None, None), ("data", None)),
    "pooler/bias": ((32,), (None,), ("data",)),
    "pooler/kernel": ((32, 32), (None, None), ("data", None)),
    "position_embeddings/embedding": ((32, 32), (None, None), ("data", None)),
    "type_embeddings/embedding": ((2, 32), (None, None), ("data", None)),
    "word_embeddings/embedding": ((96, 32), ("model", None), ("model", "data")),
}


def _named(tree):
    leaves = jax.tree_util.tree_leaves_with_path(
        tree, is_leaf=lambda x: isinstance(x, PartitionSpec | jax.ShapeDtypeStruct)
    )
    return {"/".join(str(getattr(k, "key", k)) for k in path): v for path, v in leaves}


def test_bert_sharding_table_matches_golden(devices):
    trainer = build_trainer(small_bert_config(), devices=devices, prepare_data=False)
    shapes = _named(trainer.layout.abstract_train_state["params"])
    params = _named(trainer.layout.param_specs)
    updates = _named(trainer.layout.update_specs)
    actual = {
        name: (tuple(shapes[name].shape), tuple(params[name]), tuple(updates[name]))
        for name in shapes
    }
    assert actual == GOLDEN
