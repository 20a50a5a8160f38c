"""Every setting is declared once. A run-config key is a dataclass field declared
with ``spec`` (its help text and checks); a class elsewhere that declares the same
fields again, with the same defaults, is a copy a later change updates in one place
and not the other (the algos' configs and their ``*Schema`` mirrors once were).
The sources are read with ``ast``, so no engine's optional dependency is imported."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from rlpost.algos import AdvantageConfig, DistillConfig, OffPolicyConfig, PolicyLossConfig
from rlpost.algos.preference import PreferenceConfig
from rlpost.config.groups import AlgoConfig, ModelConfig, TrainerConfig
from rlpost.trainers.lora_settings import LoraSettings
from rlpost.trainers.megatron.config import MegatronParallel

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("algos", "runtime", "trainers", "rollout", "rlpost")
MISSING = "<required>"

# Engine configs that repeat a few run-config keys, each built from the run config
# in rlpost/plan and left as it is, with why: (copy, group) -> the shared fields.
KNOWN = {
    # The FSDP2 engine takes model.* memory switches beside trainer.* ones and values
    # derived per role (lr, warm-up, device, threads): no one group is its config.
    ("trainers/fsdp/engine.py:FSDPEngineConfig", "rlpost/config/groups.py:ModelConfig"): {
        "freeze_vision", "gradient_checkpointing", "optimizer_offload", "param_offload",
    },
    # One request's sampling: rollout.* plus a seed per request; validation's
    # requests set their own temperature and n.
    ("rollout/base.py:SamplingConfig", "rlpost/config/groups.py:RolloutConfig"): {
        "min_tokens", "temperature", "top_p",
    },
    # Both pools' engine configs, each the base engine's with a KV role, and their
    # counts; rollout.pd also holds the connector, its directory and SGLang's backend.
    ("rollout/pd.py:PDEngineConfig", "rlpost/config/groups.py:PDConfig"): {
        "decode_replicas", "prefill_replicas",
    },
}  # fmt: skip


def _default(value: ast.expr | None) -> str:
    """A field's default as comparable text: ``spec(0.2, ...)`` and ``0.2`` alike."""
    if value is None:
        return MISSING
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("spec", "field"):
        keywords = {k.arg: k.value for k in value.keywords}
        if value.args:
            value = value.args[0]
        elif "default" in keywords:
            value = keywords["default"]
        elif "default_factory" in keywords:
            return ast.unparse(keywords["default_factory"]) + "()"
        else:
            return MISSING
    try:
        return repr(ast.literal_eval(value))
    except ValueError:
        return ast.unparse(value)


def _is_setting(value: ast.expr | None) -> bool:
    """Declared with ``spec`` and not ``setting=False``."""
    if not (isinstance(value, ast.Call) and ast.unparse(value.func) == "spec"):
        return False
    return not any(k.arg == "setting" and ast.unparse(k.value) == "False" for k in value.keywords)


@dataclasses.dataclass
class Declared:
    fields: dict[str, str]  # name -> default, of the fields the class body declares
    settings: set[str]  # those declared as config keys


def declarations(root: Path) -> dict[str, Declared]:
    """``path:Class`` -> what the body of each dataclass under ``root`` declares."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                if not any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                    continue
                fields, settings = {}, set()
                for stmt in node.body:
                    if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                        continue
                    if "ClassVar" in ast.unparse(stmt.annotation):
                        continue
                    fields[stmt.target.id] = _default(stmt.value)
                    if _is_setting(stmt.value):
                        settings.add(stmt.target.id)
                out[f"{path.relative_to(root).as_posix()}:{node.name}"] = Declared(fields, settings)
    return out


def copies(root: Path) -> dict[tuple[str, str], set[str]]:
    """(copy, group) -> shared fields, for each class that declares at least two of a
    group's settings again with the same defaults, and at least half its fields so."""
    found = {}
    declared = declarations(root)
    for group, g in declared.items():
        for name, c in declared.items():
            if name == group or not g.settings:
                continue
            shared = {
                f
                for f in g.settings & c.fields.keys()
                if c.fields[f] != MISSING and c.fields[f] == g.fields[f]
            }
            if len(shared) >= 2 and 2 * len(shared) >= len(c.fields):
                found[(name, group)] = shared
    return found


def names_lists(root: Path) -> dict[str, frozenset[str]]:
    """``path:NAME`` -> the names of each module-level tuple, list or set of three or
    more strings, and of each dict literal with three or more string keys (a registry),
    in ``algos/`` (the registries) and in every module that declares settings."""
    modules = {name.partition(":")[0] for name, d in declarations(root).items() if d.settings}
    modules |= {p.relative_to(root).as_posix() for p in (root / "algos").rglob("*.py")}
    out = {}
    for module in sorted(modules):
        for stmt in ast.parse((root / module).read_text()).body:
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            if not isinstance(target, ast.Name) or stmt.value is None:
                continue
            value = stmt.value
            items = value.keys if isinstance(value, ast.Dict) else []
            if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
                items = value.elts
            names = [i.value for i in items if isinstance(i, ast.Constant)]
            if (
                len(names) >= 3
                and len(names) == len(items)
                and all(isinstance(n, str) for n in names)
            ):
                out[f"{module}:{target.id}"] = frozenset(names)
    return out


def repeated_names(root: Path) -> list[tuple[str, str]]:
    lists = sorted(names_lists(root).items())
    return [
        (a, b)
        for i, (a, names_a) in enumerate(lists)
        for b, names_b in lists[i + 1 :]
        if names_a == names_b
    ]


def test_no_class_declares_a_groups_settings_again():
    # Before the algos' configs became the groups, this found eight more copies: the
    # advantage, policy-loss, off-policy, DPO and OPD schemas beside the algos'
    # configs, model.lora beside LoraSettings, trainer.megatron beside
    # MegatronParallel, and the FSDP2 OptimConfig beside trainer.* (lr_schedule,
    # lr_min_ratio, weight_decay, max_grad_norm).
    assert copies(REPO) == KNOWN


def test_no_list_of_names_is_written_twice():
    # the aggregation and KL estimator names were once listed in the config too
    assert repeated_names(REPO) == []


def test_the_algos_and_engines_configs_are_the_groups():
    algo = typing.get_type_hints(AlgoConfig)
    assert (algo["advantage"], algo["policy_loss"]) == (AdvantageConfig, PolicyLossConfig)
    assert (algo["off_policy"], algo["opd"]) == (OffPolicyConfig, DistillConfig)
    assert issubclass(algo["dpo"], PreferenceConfig)  # with the loop's precompute_ref
    assert typing.get_type_hints(ModelConfig)["lora"] is LoraSettings
    assert issubclass(typing.get_type_hints(TrainerConfig)["megatron"], MegatronParallel)
