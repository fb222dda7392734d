"""A team's own model through ``run_training(..., family=...)``, without Ray: the driver's check
of a family (``check_family``: each refusal, and the module registered to be pickled by value)
and the example of ``docs/workloads/own-model.md`` (its family has every member the worker loop
reads, and its jitted train step learns on CPU). The run on the simulated slice, a host killed:
``tests/test_goodput_ray.py`` (``own_model_run``)."""

from __future__ import annotations

import importlib.util
import pickle
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from raytpu.presets import MeshConfig, ScaleConfig
from workloads.training.config import TrainConfig
from workloads.training.family_check import FAMILY_MEMBERS, check_family

DOC = Path(__file__).resolve().parents[1] / "docs" / "workloads" / "own-model.md"
EXAMPLE_MODULE = "raytpu_doc_char_gru"
"""The module name the docs example is imported under: not ours, so pickled by value."""


def doc_example(folder: Path, name: str = EXAMPLE_MODULE) -> ModuleType:
    """The docs page's one ``python`` block written to ``folder`` and imported as ``name``
    (in ``sys.modules``, as a driver script's module is)."""
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    path = folder / f"{name}.py"
    path.write_text(block)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory):
    module = doc_example(tmp_path_factory.mktemp("own-model"))
    yield module
    sys.modules.pop(module.__name__, None)


class Partial:
    """A family that forgot ``batches`` and ``to_dict``."""

    config = None
    flops_per_token = None

    def init(self, rng): ...
    def train_step(self, state, batch): ...
    def mesh(self, devices): ...
    def state_shardings(self, mesh): ...
    def batch_sharding(self, mesh): ...


SCALE = ScaleConfig("tiny", MeshConfig.fsdp_over(8))
REFUSED = {
    # case: (family (None: the docs example's), scale, train.model, the message's fragment)
    "missing member": (Partial(), None, {}, "family: 'Partial' is not valid (missing batches, "),
    "with scale": (None, SCALE, {}, f"scale: {SCALE!r} is not valid; valid: unset with family="),
    "with train.model": (None, None, {"d_model": 8}, "train.model: {'d_model': 8} is not valid"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_check_family_refuses_before_anything_is_reserved(example, case):
    family, scale, model, fragment = REFUSED[case]
    run = TrainConfig(checkpoint_dir="gs://b/own", model=model)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        check_family(family or example.CharGRUFamily(), scale, run)


def test_the_docs_error_table_quotes_the_missing_member_message(example):
    with pytest.raises(ValueError) as refused:
        check_family(Partial(), None, TrainConfig(checkpoint_dir="gs://b/own"))
    assert f"`{str(refused.value).replace('Partial', 'CharGRUFamily')}`" in DOC.read_text()


def test_a_checked_family_is_pickled_by_value(example, monkeypatch):
    """After the check, the family unpickles where its module cannot be imported (a worker)."""
    import ray.cloudpickle

    family = example.CharGRUFamily()
    check_family(family, None, TrainConfig(checkpoint_dir="gs://b/own"))
    payload = ray.cloudpickle.dumps(family)
    monkeypatch.delitem(sys.modules, example.__name__)
    again = pickle.loads(payload)
    assert again.to_dict() == family.to_dict()  # by reference: ModuleNotFoundError


def test_the_docs_family_has_every_member_and_its_step_learns_on_cpu(example):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    family = example.CharGRUFamily()
    assert [m for m in FAMILY_MEMBERS if not hasattr(family, m)] == []
    assert family.to_dict()["family"] == "char-gru" and family.flops_per_token is None
    mesh = family.mesh(jax.devices())
    state_sharding, batch_sharding = family.state_shardings(mesh), family.batch_sharding(mesh)
    assert (mesh.axis_names, batch_sharding.spec) == (("data",), P("data"))
    init = jax.jit(family.init, out_shardings=state_sharding)
    step = jax.jit(
        family.train_step,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, NamedSharding(mesh, P())),
    )
    rows = family.batches(seed=0, host=0, hosts=1).batch(0, 4 * len(mesh.devices.flat))
    assert rows.shape[1] == family.config.seq_len + 1 and rows.dtype == np.int32
    batch = jax.device_put(rows, batch_sharding)
    state = init(jax.random.PRNGKey(0))
    state, first = step(state, batch)
    state, second = step(state, batch)
    assert int(state.step) == 2 and np.isfinite(float(first))
    assert float(second) < float(first), (first, second)
