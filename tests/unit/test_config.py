"""Config from --rdzv_conf: every key parsed, every bad value named with its fix."""

from __future__ import annotations

import math

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from torch_mingle import config as config_module
from torch_mingle._record import field_names
from torch_mingle.config import KNOWN_KEYS, MingleConfig
from torch_mingle.errors import MingleConfigError


def make(**conf):
    return MingleConfig.from_mapping(run_id="job42", min_nodes=2, max_nodes=4, conf=conf)


def test_defaults_match_c10d_where_c10d_has_the_key_and_detect_a_failure_within_1_4_s():
    cfg = make()
    assert (cfg.join_timeout, cfg.last_call_timeout, cfg.close_timeout) == (600.0, 30.0, 30.0)
    assert (cfg.keep_alive_interval, cfg.keep_alive_max_attempt) == (0.2, 7)  # c10d: 5 s x 3
    assert cfg.keep_alive_timeout == pytest.approx(1.4)
    assert cfg.group == "239.255.77.77" and cfg.port == 29477 and cfg.ttl == 1
    assert cfg.interface is None


@pytest.mark.parametrize(("max_nodes", "interval"), [(1, 0.2), (1000, 0.2), (4096, 0.8192), (16384, 3.2768)])
def test_the_default_heartbeat_grows_with_the_job_past_a_thousand_nodes(max_nodes, interval):
    cfg = MingleConfig.from_mapping(run_id="job42", min_nodes=1, max_nodes=max_nodes, conf={})
    assert cfg.keep_alive_interval == pytest.approx(interval)
    assert max_nodes / cfg.keep_alive_interval <= config_module.LEADER_BEATS_PER_S
    assert "keep_alive_interval" not in cfg.explicit
    chosen = MingleConfig.from_mapping(
        run_id="job42", min_nodes=1, max_nodes=max_nodes, conf={"keep_alive_interval": "0.5"}
    )
    assert chosen.keep_alive_interval == 0.5  # a value the user set wins at any size


def test_values_arrive_as_strings_from_torchrun():
    params = RendezvousParameters(
        "mingle",
        "",
        "job42",
        2,
        4,
        interface="eth1",
        join_timeout="60",
        port="30001",
        keep_alive_interval="0.5",
        timeout=900,
    )
    cfg = MingleConfig.from_params(params)
    assert cfg.interface == "eth1"
    assert cfg.join_timeout == 60.0
    assert cfg.port == 30001
    assert cfg.keep_alive_interval == 0.5
    assert cfg.timeout == 900.0
    assert cfg.explicit == {"interface", "join_timeout", "port", "keep_alive_interval", "timeout"}


@pytest.mark.parametrize(
    ("raw", "seconds"), [("never", math.inf), (" Never ", math.inf), ("0", 0.0), ("45", 45.0)]
)
def test_rejoin_delay_is_seconds_or_never(raw, seconds):
    params = RendezvousParameters("mingle", "", "job42", 2, 4, rejoin_delay=raw)
    assert MingleConfig.from_params(params).rejoin_delay == seconds


def test_every_known_key_is_a_field_of_the_same_name():
    fields = set(field_names(MingleConfig))
    assert set(KNOWN_KEYS) <= fields
    assert set(KNOWN_KEYS) == set(config_module._PARSERS)


@pytest.mark.parametrize(
    ("conf", "needle"),
    [
        ({"port": "0"}, "port='0' is out of range 1..65535"),
        ({"port": "http"}, "port='http' is not an integer"),
        ({"join_timeout": "soon"}, "join_timeout='soon' is not a number of seconds"),
        ({"join_timeout": "-1"}, "join_timeout='-1' is out of range: it must be between 0.001 and"),
        (
            {"join_timeout": "1e15"},
            "join_timeout='1e15' is out of range: it must be between 0.001 and 31536000",
        ),
        ({"rejoin_delay": "inf"}, "rejoin_delay='inf' is out of range"),
        ({"keep_alive_interval": "nan"}, "keep_alive_interval='nan'"),
        ({"group": "10.0.0.1"}, "group='10.0.0.1' is not a multicast address"),
        ({"group": "not-an-ip"}, "group='not-an-ip' is not an IP address"),
        ({"ttl": "0"}, "ttl='0' is out of range 1..255"),
        ({"interface": "  "}, "interface is empty"),
    ],
)
def test_bad_values_name_the_value_and_the_fix(conf, needle):
    with pytest.raises(MingleConfigError, match=None) as err:
        make(**conf)
    assert needle in str(err.value)


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(
        MingleConfigError, match=r"unknown --rdzv_conf key 'intrface'.*Did you mean 'interface'"
    ):
        make(intrface="eth0")


def test_config_errors_are_value_errors_and_rendezvous_errors():
    from torch.distributed.elastic.rendezvous import RendezvousError

    with pytest.raises(ValueError) as err:
        make(port="0")
    assert isinstance(err.value, RendezvousError)


def test_dubious_but_valid_settings_are_warned_about():
    assert make(last_call_timeout="100", join_timeout="10").warnings()
    assert not make().warnings()


def test_run_id_limits():
    with pytest.raises(MingleConfigError, match="--rdzv_id"):
        MingleConfig.from_mapping(run_id="", min_nodes=1, max_nodes=1, conf={})
    with pytest.raises(MingleConfigError, match=r"no --rdzv_id was given .* same --rdzv_id=<job name>"):
        MingleConfig.from_mapping(run_id="none", min_nodes=1, max_nodes=1, conf={})
    with pytest.raises(MingleConfigError, match="at most 200"):
        MingleConfig.from_mapping(run_id="x" * 201, min_nodes=1, max_nodes=1, conf={})


def test_secret_from_the_file_the_environment_or_none(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef-a-shared-secret\n")
    secret.chmod(0o600)
    assert make(secret_file=str(secret)).load_secret({}) == b"0123456789abcdef-a-shared-secret"
    assert (
        make().load_secret({"TORCH_MINGLE_SECRET_FILE": str(secret)}) == b"0123456789abcdef-a-shared-secret"
    )
    assert (
        make().load_secret({"TORCH_MINGLE_SECRET": "  inline-secret-0123456789 "})
        == b"inline-secret-0123456789"
    )
    # The rdzv_conf key wins over the environment, the file variable over the inline one.
    assert (
        make(secret_file=str(secret)).load_secret({"TORCH_MINGLE_SECRET": "x" * 20})
        == secret.read_bytes().strip()
    )
    assert make().load_secret({}) is None


def test_secret_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(MingleConfigError, match=r"secret_file='/nonexistent/secret' cannot be read"):
        make(secret_file="/nonexistent/secret").load_secret({})
    short = tmp_path / "short"
    short.write_text("tiny")
    with pytest.raises(MingleConfigError, match=r"4 bytes long; use at least 16.*openssl rand"):
        make(secret_file=str(short)).load_secret({})


def test_every_key_can_come_from_the_environment_and_rdzv_conf_wins(monkeypatch):
    # For launchers that cannot pass --rdzv_conf (TorchX's dist.ddp): $TORCH_MINGLE_<KEY>.
    monkeypatch.setenv("TORCH_MINGLE_INTERFACE", "127.0.0.1")
    monkeypatch.setenv("TORCH_MINGLE_PORT", "30002")
    monkeypatch.setenv("TORCH_MINGLE_JOIN_TIMEOUT", " ")  # blank: not set
    cfg = MingleConfig.from_params(RendezvousParameters("mingle", "", "job42", 2, 4, port="30001"))
    assert (cfg.interface, cfg.port, cfg.join_timeout) == ("127.0.0.1", 30001, 600.0)
    assert cfg.explicit == {"interface", "port"}


def test_a_bad_value_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("TORCH_MINGLE_KEEP_ALIVE_INTERVAL", "soon")
    with pytest.raises(MingleConfigError, match=r"^\$TORCH_MINGLE_KEEP_ALIVE_INTERVAL='soon': .*seconds"):
        MingleConfig.from_params(RendezvousParameters("mingle", "", "job42", 2, 4))


@pytest.mark.parametrize("endpoint", ["None:None", "None:29500", "localhost:29500"])
def test_an_endpoint_is_accepted_and_kept_for_the_warning_not_parsed(endpoint):
    # accelerate passes "None:<port>", TorchX "localhost:29500": neither is parsed, nor used.
    cfg = MingleConfig.from_params(RendezvousParameters("mingle", endpoint, "job42", 2, 4))
    assert cfg.endpoint == endpoint
    assert MingleConfig.from_params(RendezvousParameters("mingle", "", "job42", 2, 4)).endpoint == ""


def test_peers_and_the_secret_file_keep_their_own_variables(monkeypatch):
    monkeypatch.setenv("TORCH_MINGLE_PEERS", "hostA,hostB")  # commas: as documented before
    cfg = MingleConfig.from_params(RendezvousParameters("mingle", "", "job42", 2, 4))
    assert cfg.peers is None and cfg.peer_hosts() == ("hostA", "hostB")


def test_a_fix_keeps_the_users_other_keys_and_suggests_the_default():
    """The fix is the whole --rdzv_conf to pass: the user's keys kept, torch's own ``timeout`` not."""
    params = RendezvousParameters(
        "mingle", "", "job42", 2, 4, interface="127.0.0.1", keep_alive_max_attempt="0", timeout=900
    )
    with pytest.raises(MingleConfigError) as err:
        MingleConfig.from_params(params)
    assert str(err.value).endswith(
        "out of range 1..1000; fix: --rdzv_conf interface=127.0.0.1,keep_alive_max_attempt=7"
    ), str(err.value)
    with pytest.raises(MingleConfigError, match=r"fix: --rdzv_conf keep_alive_interval=0.2$"):
        make(keep_alive_interval="0")


def test_a_misspelt_variable_is_named_with_the_one_meant(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_MINGLE_JOIN_TIMOUT", "5")
    monkeypatch.setenv("TORCH_MINGLE_LOG", "info")  # read elsewhere: known
    with caplog.at_level("WARNING", logger="torch_mingle"):
        MingleConfig.from_params(RendezvousParameters("mingle", "", "job42", 2, 4))
    (said,) = [r.getMessage() for r in caplog.records if "TORCH_MINGLE_" in r.getMessage()]
    assert said.startswith("$TORCH_MINGLE_JOIN_TIMOUT is set but no torch_mingle setting has that name")
    assert said.endswith("did you mean $TORCH_MINGLE_JOIN_TIMEOUT?"), said


def test_a_refused_setting_is_logged_at_error_before_torch_prints_its_traceback(caplog):
    from torch_mingle.handler import MingleRendezvousHandler

    params = RendezvousParameters("mingle", "", "job42", 2, 4, join_timeout="soon")
    with caplog.at_level("ERROR", logger="torch_mingle"), pytest.raises(MingleConfigError):
        MingleRendezvousHandler.from_params(params)
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "join_timeout='soon' is not a number of seconds" in record.getMessage()
