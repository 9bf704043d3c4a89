from __future__ import annotations

import math

import pytest

import controller
from controller import BackendConfig, ConfigError, ReplicaConfig

from ..conftest import RC, config, opened


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        ({"num_replicas": -1}, "BackendConfig.num_replicas", "whole number from 0 to"),
        ({"num_replicas": 1.5}, "BackendConfig.num_replicas", "whole number from 0 to"),
        ({"num_replicas": True}, "BackendConfig.num_replicas", "whole number from 0 to"),
        ({"num_replicas": "3"}, "BackendConfig.num_replicas", "whole number from 0 to"),
        ({"version": ""}, "BackendConfig.version", "printable"),
        ({"version": "v\u00e9"}, "BackendConfig.version", "printable ASCII"),
        ({"num_replicas": 10**6 + 1}, "BackendConfig.num_replicas", "from 0 to 1000000"),
        ({"max_surge": 1.5}, "BackendConfig.max_surge", "between 0.0 and 1.0"),
        ({"graceful_shutdown_timeout_s": -1}, "BackendConfig.graceful_shutdown_timeout_s", ">= 0"),
        ({"start_timeout_s": 0}, "BackendConfig.start_timeout_s", "> 0"),
        ({"start_timeout_s": math.inf}, "BackendConfig.start_timeout_s", "finite"),
        ({"resources": {"CPU": -1}}, "BackendConfig.resources['CPU']", "from 0 to 1e+15"),
        ({"resources": ["CPU"]}, "BackendConfig.resources", "mapping"),
        ({"user_config": {"a": {1, 2}}}, "BackendConfig.user_config['a']", "must be JSON"),
        ({"user_config": {1: "x"}}, "BackendConfig.user_config", "keys are strings"),
        ({"user_config": [math.nan]}, "BackendConfig.user_config[0]", "NaN"),
        ({"health_check_period_s": 1e-9}, "BackendConfig.health_check_period_s", "at least 0.1"),
    ],
)
def test_backend_config_errors_name_field_and_rule(
    kwargs: dict[str, object], field: str, rule: str
) -> None:
    with pytest.raises(ConfigError) as info:
        BackendConfig(**kwargs)
    assert info.value.field == field
    assert rule in str(info.value)
    assert str(info.value).startswith(field)


@pytest.mark.parametrize("entrypoint", ["", "module", "mod:", ":Cls", "a b:C", "pkg.mod:Cls()", 3])
def test_malformed_entrypoint(entrypoint: object) -> None:
    with pytest.raises(ConfigError, match=r"ReplicaConfig.entrypoint: must look like"):
        ReplicaConfig(entrypoint)


def test_replica_config_args_must_be_json() -> None:
    with pytest.raises(ConfigError, match=r"init_args\[1\]"):
        ReplicaConfig("m:C", init_args=[1, object()])
    with pytest.raises(ConfigError, match="init_kwargs"):
        ReplicaConfig("m:C", init_kwargs={"not an identifier": 1})


def test_from_dict_rejects_unknown_and_missing_fields() -> None:
    with pytest.raises(ConfigError) as info:
        BackendConfig.from_dict({"num_replicas": 2, "replicas": 3})
    assert info.value.field == "BackendConfig.replicas"
    assert "unknown field" in str(info.value)
    assert "num_replicas" in str(info.value)  # it lists what is known
    with pytest.raises(ConfigError, match=r"ReplicaConfig\.entrypoint: is required"):
        ReplicaConfig.from_dict({})
    assert BackendConfig.from_dict({"num_replicas": 2}) == BackendConfig(num_replicas=2)


def test_configs_compare_by_value_and_normalize() -> None:
    assert BackendConfig(resources={"CPU": 1}) == BackendConfig(resources={"CPU": 1.0})
    assert ReplicaConfig("m:C", init_args=[1]) == ReplicaConfig("m:C", init_args=(1,))


def test_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="replicas"):
        BackendConfig(replicas=3)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["", "a/b", "a#b", "-x", "x" * 64, 7])
async def test_bad_backend_name_is_refused_before_any_write(name: object) -> None:
    store = controller.MemoryStore()
    async with opened(store=store) as ctl:
        with pytest.raises(ConfigError, match="name: a backend name is"):
            await ctl.deploy(name, config(), RC)  # type: ignore[arg-type]
    assert store.writes == 0


async def test_wrong_types_are_refused_before_any_write() -> None:
    store = controller.MemoryStore()
    async with opened(store=store) as ctl:
        with pytest.raises(
            ConfigError, match=r"backend_config: must be a controller\.BackendConfig"
        ):
            await ctl.deploy("a", {"num_replicas": 1}, RC)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="replica_config"):
            await ctl.deploy("a", config(), "m:C")  # type: ignore[arg-type]
    assert store.writes == 0


async def test_unknown_backend() -> None:
    async with opened() as ctl:
        with pytest.raises(controller.UnknownBackendError, match="backend 'nope' is not deployed"):
            await ctl.delete("nope")
        with pytest.raises(controller.UnknownBackendError):
            ctl.status("nope")


@pytest.mark.parametrize(
    "field", ["max_surge", "max_unavailable", "health_check_failure_threshold"]
)
@pytest.mark.parametrize("value", [1e308, 10**9, 1_000_001])
def test_every_count_has_an_upper_bound(field: str, value: float) -> None:
    # Found by an outside attack: these took 1e308 (a count no arithmetic downstream bounds).
    with pytest.raises(controller.ConfigError, match=f"{field}: .*1000000") as info:
        controller.BackendConfig(**{field: value})
    assert info.value.field == f"BackendConfig.{field}"
    assert getattr(controller.BackendConfig(**{field: 1_000_000}), field) == 1_000_000
