"""compose/: the stack's docker-compose.yml and the node kit (systemd unit, Slurm wiring, Kubernetes
DaemonSet and ServiceMonitor). There is no Docker engine here, so the file is checked by
`docker-compose config`, and everything it references by the tools and validators that will read it:
promtool and amtool on the configs as the containers see them (mounts applied), gpufleet's own
config validation and argument parser, and cross-checks of images, ports, mounts and paths."""

from __future__ import annotations

import argparse
import configparser
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.realstack.debian import ensure_packages, which
from tests.realstack.policy import unavailable

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
NODE = COMPOSE / "node"
PROFILES = ("gpu", "sim")
GPUFLEET_IMAGE = "gpufleet:0.1.0"
# Contract 5 (shared/DESIGN.md): flags fixed for subcommands whose module may not exist yet.
CONTRACT_FLAGS = {"dashboard": {"--config", "--listen"}, "report": {"--config", "--week", "--from", "--to", "--out", "--send"}}


# ---------------------------------------------------------------- reading the compose file


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # PyYAML resolves the x- anchors and << merges


def services() -> dict[str, dict]:
    return compose()["services"]


def interpolate(text: str) -> str:
    """Compose's ${VAR:-default} with no variable set: the default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", text)


def mounts(svc: dict) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of each short-syntax volume entry."""
    out = []
    for v in svc.get("volumes", []):
        parts = v.split(":")
        out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def is_bind(source: str) -> bool:
    return source.startswith((".", "/"))


def host_path(svc: dict, container_path: str) -> Path | None:
    """The file in this repository a container path of `svc` is, through its bind mounts."""
    for source, target, _ in sorted(mounts(svc), key=lambda m: -len(m[1])):
        if is_bind(source) and not source.startswith("/") and (container_path == target or container_path.startswith(target + "/")):
            return (COMPOSE / source / os.path.relpath(container_path, target)).resolve()
    return None


def command(svc: dict) -> list[str]:
    cmd = svc.get("command", [])
    return [interpolate(c) for c in (cmd.split() if isinstance(cmd, str) else cmd)]


def flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def gpufleet_config(svc: dict) -> dict:
    path = host_path(svc, flag(command(svc), "--config"))
    assert path and path.is_file(), f"--config of {svc.get('command')} is not mounted from this repository"
    return tomllib.loads(path.read_text())


def port_of(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def listening_port(name: str, svc: dict) -> int:
    """The port the service's process listens on, from its own command, environment or config."""
    args = command(svc)
    if name == "dcgm-exporter":
        return port_of(svc["environment"]["DCGM_EXPORTER_LISTEN"])
    if svc.get("image") == GPUFLEET_IMAGE:
        if flag(args, "--listen"):
            return port_of(flag(args, "--listen"))
        section = {"exporter": "exporter", "collect": "collector"}[args[0]]
        return port_of(gpufleet_config(svc)[section]["listen"])
    return port_of(flag(args, "--web.listen-address"))


def active(profile: str) -> dict[str, dict]:
    return {n: s for n, s in services().items() if not s.get("profiles") or profile in s["profiles"]}


def dns_names(profile: str) -> dict[str, str]:
    """Names a service answers to on the compose network -> service."""
    out = {}
    for n, s in active(profile).items():
        out[n] = n
        for alias in ((s.get("networks") or {}).get("default") or {}).get("aliases", []):
            out[alias] = n
    return out


def container_view(name: str, root: Path) -> Path:
    """Copy what `name`'s bind mounts put into its container under `root`; returns `root`."""
    for source, target, _ in mounts(services()[name]):
        dest = root / target.lstrip("/")
        if not is_bind(source):
            dest.mkdir(parents=True, exist_ok=True)
            continue
        src = COMPOSE / source
        if source.startswith("/"):
            dest.mkdir(parents=True, exist_ok=True)
        elif src.is_dir():
            shutil.copytree(src, dest)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest)
    return root


def thresholds() -> dict:
    return yaml.safe_load((ROOT / "alerts" / "thresholds.yml").read_text())


def selector_matches(selector: str, job: str) -> bool:
    m = re.fullmatch(r'job(=~|=)"([^"]*)"', selector)
    assert m, selector
    return bool(re.fullmatch(m.group(2), job)) if m.group(1) == "=~" else m.group(2) == job


# ---------------------------------------------------------------- the compose file itself


@pytest.mark.realstack
def test_docker_compose_accepts_the_file_in_both_profiles():
    ensure_packages("docker-compose")
    binary = which("docker-compose")
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    for profile in PROFILES:
        r = subprocess.run(
            [binary, "--project-directory", str(COMPOSE), "-f", str(COMPOSE_FILE), "--profile", profile, "config"],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert r.returncode == 0, r.stderr
        resolved = yaml.safe_load(r.stdout)
        assert set(resolved["services"]) == set(services())
        assert set(resolved["volumes"]) == {"prometheus-data", "alertmanager-data", "gpufleet-store"}
        for gpu_service in ("dcgm-exporter", "gpufleet-exporter"):
            devices = resolved["services"][gpu_service]["deploy"]["resources"]["reservations"]["devices"]
            assert devices == [{"capabilities": ["gpu", "utility"], "count": "all", "driver": "nvidia"}]
        assert resolved["services"]["gpufleet-exporter"]["pid"] == "host"
        assert resolved["services"]["dcgm-exporter"]["environment"]["NODE_NAME"] == "gpu-node-1"


def test_services_profiles_and_images():
    svcs = services()
    assert set(svcs) == {
        "dcgm-exporter", "gpufleet-exporter", "gpufleet-exporter-sim", "prometheus", "alertmanager",
        "gpufleet-collector", "gpufleet-dashboard",
    }
    assert set(active("gpu")) - set(active("sim")) == {"dcgm-exporter", "gpufleet-exporter"}
    assert set(active("sim")) - set(active("gpu")) == {"gpufleet-exporter-sim"}
    for name, svc in svcs.items():
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image's tag"
        if "build" in svc:
            assert image == GPUFLEET_IMAGE
            assert (COMPOSE / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == COMPOSE / "Dockerfile"
    gpufleet = {n for n, s in svcs.items() if s["image"] == GPUFLEET_IMAGE}
    assert gpufleet == {"gpufleet-exporter", "gpufleet-exporter-sim", "gpufleet-collector", "gpufleet-dashboard"}
    # the node's name is the Hostname label of both exporters, so the rules can join them
    assert svcs["dcgm-exporter"]["environment"]["NODE_NAME"] == svcs["gpufleet-exporter"]["environment"]["NODE_NAME"]


def test_dockerfile_installs_every_package_pyproject_declares():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # the repository folders that pyproject maps into the gpufleet namespace (report lives under dashboards/)
    packages = {d.split("/")[0] for d in pyproject["tool"]["setuptools"]["package-dir"].values()}
    assert packages == {"gpufleet", "exporter", "collector", "analytics", "dashboards"}
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    copied = {m.split()[0] for m in re.findall(r"(?m)^COPY\s+(.+)$", dockerfile)}
    copied |= {w for m in re.findall(r"(?m)^COPY\s+(.+)$", dockerfile) for w in m.split()[:-1]}
    assert packages <= copied, f"not copied into the image: {packages - copied}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    assert re.search(r"""pip install '\.\[all\]'""", dockerfile)
    assert re.search(r'(?m)^ENTRYPOINT \["gpufleet"\]', dockerfile)
    allowed = {ln[1:].rstrip("/") for ln in (COMPOSE / "Dockerfile.dockerignore").read_text().splitlines() if ln.startswith("!")}
    assert copied <= allowed, f"excluded from the build context: {copied - allowed}"
    for c in copied:
        assert (ROOT / c).exists(), c
    # the non-root services run as the user the image creates and owns the store for
    uid = re.search(r"--uid (\d+)", dockerfile).group(1)
    for name in ("gpufleet-collector", "gpufleet-dashboard"):
        assert services()[name]["user"] == uid


def test_published_ports_are_the_ports_the_services_listen_on():
    for profile in PROFILES:
        published = {}
        for name, svc in active(profile).items():
            listen = listening_port(name, svc)
            ports = svc.get("ports", [])
            assert ports, f"{name} publishes no port"
            for p in ports:
                host, container = (int(x) for x in str(p).split(":"))
                assert container == listen, f"{name}: publishes {container}, listens on {listen}"
                assert host not in published, f"profile {profile}: {name} and {published[host]} both publish {host}"
                published[host] = name


def test_prometheus_scrapes_the_services_of_the_stack_under_the_job_names_the_rules_expect():
    svcs = services()
    prom = yaml.safe_load(host_path(svcs["prometheus"], flag(command(svcs["prometheus"]), "--config.file")).read_text())
    jobs = {}
    for profile in PROFILES:
        names = dns_names(profile)
        for sc in prom["scrape_configs"]:
            targets = [t for s in sc.get("static_configs", []) for t in s["targets"]]
            targets += [f"{n}:{d['port']}" for d in sc.get("dns_sd_configs", []) for n in d["names"]]
            for target in targets:
                host, port = target.rsplit(":", 1)
                service = "prometheus" if host == "localhost" and sc["job_name"] == "prometheus" else names.get(host)
                if service is None:
                    # a DNS-discovered exporter of the other profile: no target, nothing to alert on
                    assert sc.get("dns_sd_configs"), f"profile {profile}: {target} is no service"
                    continue
                assert int(port) == listening_port(service, active(profile)[service]), (profile, target)
                jobs.setdefault(sc["job_name"], set()).add(service)
        for am in prom["alerting"]["alertmanagers"]:
            for target in (t for s in am["static_configs"] for t in s["targets"]):
                host, port = target.rsplit(":", 1)
                assert names[host] == "alertmanager" and int(port) == listening_port("alertmanager", svcs["alertmanager"])
    assert jobs["gpufleet-exporter"] == {"gpufleet-exporter", "gpufleet-exporter-sim"}
    assert jobs["dcgm-exporter"] == {"dcgm-exporter"}
    t = thresholds()
    for job in ("gpufleet-exporter", "dcgm-exporter"):
        assert selector_matches(t["exporter_targets"], job)
    assert selector_matches(t["collector_targets"], "gpufleet-collector")
    assert not selector_matches(t["exporter_targets"], "gpufleet-collector")
    assert prom["global"]["external_labels"]["cluster"]  # Alertmanager groups by it


def test_mounts_data_volumes_and_the_paths_the_configs_use():
    doc = compose()
    svcs = doc["services"]
    declared = set(doc["volumes"])
    for name, svc in svcs.items():
        for source, target, _ in mounts(svc):
            if not is_bind(source):
                assert source in declared, f"{name}: volume {source} is not declared"
            elif not source.startswith("/"):
                assert (COMPOSE / source).exists(), f"{name}: {source} does not exist"
    # Prometheus: its config and the generated rules, data on a volume
    prom = svcs["prometheus"]
    args = command(prom)
    assert host_path(prom, flag(args, "--config.file")) == COMPOSE / "prometheus" / "prometheus.yml"
    assert host_path(prom, "/etc/prometheus/rules") == ROOT / "alerts" / "rules"
    assert ("prometheus-data", flag(args, "--storage.tsdb.path"), False) in mounts(prom)
    # Alertmanager: the example configuration, data on a volume
    am = svcs["alertmanager"]
    args = command(am)
    assert host_path(am, flag(args, "--config.file")) == ROOT / "alerts" / "alertmanager.yml"
    assert ("alertmanager-data", flag(args, "--storage.path"), False) in mounts(am)
    # dcgm-exporter: the counters file it is told to use is mounted
    dcgm = svcs["dcgm-exporter"]
    assert host_path(dcgm, dcgm["environment"]["DCGM_EXPORTER_COLLECTORS"]) == COMPOSE / "dcgm-exporter" / "counters.csv"
    # the real exporter reads the prolog's files and writes the device map on the host's /run/gpufleet
    exp = svcs["gpufleet-exporter"]
    cfg = gpufleet_config(exp)["exporter"]
    run = [t for s, t, ro in mounts(exp) if s == "/run/gpufleet" and not ro]
    assert run == ["/run/gpufleet"]
    for key in ("job_map_dir", "device_map_file"):
        assert cfg[key].startswith("/run/gpufleet/"), key
    # the simulated exporter's scenario and job mapping are mounted from the repository
    sim = svcs["gpufleet-exporter-sim"]
    cfg = gpufleet_config(sim)["exporter"]
    assert host_path(sim, cfg["sim_scenario"]) == ROOT / "exporter" / "scenarios" / "demo-node.toml"
    assert host_path(sim, cfg["job_map_dir"]) == COMPOSE / "sim" / "job-mapping"
    # the collector writes the store on a volume; the dashboard reads the same volume, read-only
    store = gpufleet_config(svcs["gpufleet-collector"])["collector"]["store"]
    assert ("gpufleet-store", store, False) in mounts(svcs["gpufleet-collector"])
    assert ("gpufleet-store", store, True) in mounts(svcs["gpufleet-dashboard"])
    # the collector reads Prometheus through the service name and port
    url = gpufleet_config(svcs["gpufleet-collector"])["collector"]["prometheus"]["url"]
    m = re.fullmatch(r"http://([^:/]+):(\d+)/?", url)
    assert m and m.group(1) == "prometheus" and int(m.group(2)) == listening_port("prometheus", prom)


@pytest.mark.realstack
def test_promtool_check_config_as_the_prometheus_container_sees_it(promtool, tmp_path):
    root = container_view("prometheus", tmp_path)
    config = root / "etc" / "prometheus" / "prometheus.yml"
    r = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    rules = sorted((ROOT / "alerts" / "rules").glob("*.rules.yml"))
    for rule_file in rules:
        assert f"Checking {root / 'etc/prometheus/rules' / rule_file.name}" in out, out
    assert f"SUCCESS: {len(rules)} rule files found" in out, out
    assert out.count(" rules found") == len(rules), out


@pytest.mark.realstack
def test_amtool_check_config_as_the_alertmanager_container_sees_it(amtool, tmp_path):
    root = container_view("alertmanager", tmp_path)
    args = command(services()["alertmanager"])
    r = subprocess.run([amtool, "check-config", str(root / flag(args, "--config.file").lstrip("/"))], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def _exporter_options(path: Path, text: str | None = None) -> dict:
    from gpufleet.exporter.cli import resolve_options

    if text is not None:
        path.write_text(text)
    ns = argparse.Namespace(config=str(path), backend=None, sim_gpus=None, sim_model=None, sim_scenario=None, listen=None,
                            web_config=None, job_map_dir=None, poll_interval=None, hostname=None)
    return resolve_options(ns)


def test_gpufleet_configs_pass_gpufleet_validation_and_commands_parse():
    from gpufleet.collector import config as collector_config
    from gpufleet.cli import SUBCOMMANDS, parse_args

    stack = COMPOSE / "gpufleet" / "gpufleet.toml"
    assert _exporter_options(stack)["backend"] == "nvml"
    assert collector_config.load(tomllib.loads(stack.read_text()), stack)["prometheus"]["url"]
    assert _exporter_options(COMPOSE / "sim" / "exporter.toml")["backend"] == "sim"
    assert _exporter_options(NODE / "gpufleet.toml")["backend"] == "nvml"
    for name, svc in services().items():
        if svc["image"] != GPUFLEET_IMAGE:
            continue
        args = command(svc)
        if args[0] in SUBCOMMANDS:
            ns = parse_args(args)
            assert ns.command == args[0], name
        else:  # a subcommand still being built: its flags are fixed by the design's Contract 5
            given = {a.split("=")[0] for a in args[1:] if a.startswith("--")}
            assert given <= CONTRACT_FLAGS[args[0]], name


def test_simulated_node_scenario_and_job_mapping_agree():
    from gpufleet.exporter.backends import sim_scenario

    scenario = sim_scenario.load(str(ROOT / "exporter" / "scenarios" / "demo-node.toml"))
    files = sorted((COMPOSE / "sim" / "job-mapping").iterdir())
    assert [int(f.name) for f in files] == list(range(scenario.gpus))
    for f in files:
        assert re.fullmatch(r"(\d+\n)+", f.read_text()), f
    # the idle notebook (GPU 5) and the GPU without a process (GPU 6) are held, so the waste alerts fire
    assert scenario.spec(5).utilization.at(0) == 0 and scenario.spec(5).processes
    assert not scenario.spec(6).processes


def test_dcgm_counters_cover_the_exporter_fields_and_every_field_the_rules_read():
    from gpufleet.exporter.fields import FIELDS

    counters = {}
    for line in (COMPOSE / "dcgm-exporter" / "counters.csv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, _help = (x.strip() for x in line.split(",", 2))
            counters[name] = kind
    for name, field in FIELDS.items():
        assert counters.get(name) == field.kind, name
    assert counters["DCGM_FI_DRIVER_VERSION"] == "label"
    rules_text = "".join(p.read_text() for p in (ROOT / "alerts" / "rules").glob("*.rules.yml"))
    # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: the rules also accept this older name of the same field
    read = set(re.findall(r"DCGM_FI_[A-Z_]+", rules_text)) - {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}
    assert read <= set(counters), f"the rules read fields dcgm-exporter is not told to export: {read - set(counters)}"


# ---------------------------------------------------------------- the node kit


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    unit.optionxform = str
    unit.read_string(path.read_text())
    return unit


def test_systemd_unit_runs_the_exporter_on_the_node_config():
    from gpufleet.cli import parse_args

    unit = _unit(NODE / "systemd" / "gpufleet-exporter.service")
    exec_start = unit["Service"]["ExecStart"].split()
    assert exec_start[0].endswith("/bin/gpufleet")
    ns = parse_args(exec_start[1:])
    assert ns.command == "exporter" and ns.config == "/etc/gpufleet/gpufleet.toml"
    assert "compose/node/gpufleet.toml /etc/gpufleet/gpufleet.toml" in (NODE / "systemd" / "gpufleet-exporter.service").read_text()
    # the unit owns /run/gpufleet, where the node config keeps the job mapping and the device map
    cfg = _exporter_options(NODE / "gpufleet.toml")
    run_dir = "/run/" + unit["Service"]["RuntimeDirectory"]
    assert unit["Service"]["RuntimeDirectoryPreserve"] == "yes"
    for key in ("job_map_dir", "device_map_file"):
        assert cfg[key].startswith(run_dir + "/"), key
    # and the Slurm prolog writes where the exporter reads (jobmap-lib.sh's defaults)
    lib = (NODE / "slurm" / "jobmap-lib.sh").read_text()
    assert re.search(rf"(?m)^JOB_MAP_DIR={re.escape(cfg['job_map_dir'])}$", lib)
    assert re.search(rf"(?m)^DEVICE_MAP={re.escape(cfg['device_map_file'])}$", lib)
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.realstack
def test_systemd_analyze_verify(tmp_path):
    ensure_packages("systemd")
    analyze = which("systemd-analyze")
    if not analyze:
        unavailable("Debian package systemd is installed but systemd-analyze is not on PATH")
    # systemd-analyze checks that ExecStart exists: point it at this checkout's gpufleet
    gpufleet = shutil.which("gpufleet") or str(Path(sys.executable).parent / "gpufleet")
    text = (NODE / "systemd" / "gpufleet-exporter.service").read_text()
    unit = tmp_path / "gpufleet-exporter.service"
    unit.write_text(text.replace("/opt/gpufleet/bin/gpufleet", gpufleet))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if "gpufleet-exporter.service" in ln]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_slurm_conf_snippet_wires_the_shipped_prolog_and_epilog():
    lines = {}
    for line in (NODE / "slurm" / "slurm.conf.gpufleet").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            lines[key.strip()] = value.strip()
    assert set(lines) == {"Prolog", "Epilog", "PrologFlags"}
    assert "Alloc" in lines["PrologFlags"].split(",")
    for key, script in (("Prolog", "prolog.sh"), ("Epilog", "epilog.sh")):
        assert lines[key] == f"/etc/gpufleet/slurm/{script}"
        assert os.access(NODE / "slurm" / script, os.X_OK), script
        # the scripts document the same lines
        assert f"{key}={lines[key]}" in (NODE / "slurm" / "prolog.sh").read_text()


def _k8s() -> dict[str, dict]:
    docs = []
    for path in sorted((NODE / "kubernetes").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {d["kind"]: d for d in docs}


def test_kubernetes_daemonset_service_and_servicemonitor_fit_together(tmp_path):
    k = _k8s()
    assert set(k) == {"Namespace", "ConfigMap", "DaemonSet", "Service", "ServiceMonitor"}
    ns = k["Namespace"]["metadata"]["name"]
    ds, svc, sm, cm = k["DaemonSet"], k["Service"], k["ServiceMonitor"], k["ConfigMap"]
    for d in (ds, svc, sm, cm):
        assert d["metadata"]["namespace"] == ns
    pod = ds["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert ns in sm["spec"]["namespaceSelector"]["matchNames"]
    # the scrape job is named after the Service's label, and that name is what the rules expect
    job = svc["metadata"]["labels"][sm["spec"]["jobLabel"]]
    assert selector_matches(thresholds()["exporter_targets"], job)

    (container,) = pod["spec"]["containers"]
    assert container["image"] == GPUFLEET_IMAGE
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["targetPort"] in ports and svc_port["name"] == sm["spec"]["endpoints"][0]["port"]

    # the config comes from the ConfigMap, is valid, and listens on the container's port
    args = container["args"]
    config_path = flag(args, "--config")
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts_ = {m["mountPath"]: m for m in container["volumeMounts"]}
    config_mount = mounts_[str(Path(config_path).parent)]
    assert vols[config_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    opts = _exporter_options(tmp_path / "gpufleet.toml", cm["data"][Path(config_path).name])
    assert port_of(opts["listen"]) == ports[svc_port["targetPort"]]
    # the kubelet's pod-resources socket is mounted where the config looks for it
    sock = opts["kubelet_socket"]
    pr = mounts_[str(Path(sock).parent)]
    assert vols[pr["name"]]["hostPath"]["path"] == str(Path(sock).parent) == "/var/lib/kubelet/pod-resources"
    assert opts["cgroup_mapping"] is False and opts["job_map_dir"] == "" and opts["device_map_file"] == ""
    # Hostname = the node's name, as dcgm-exporter's under the GPU operator
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))  # watches GPUs, takes none
    from gpufleet.cli import parse_args

    assert parse_args(args).command == "exporter"
