"""The deployment files in ``infra/``, checked offline as a user would apply them.

* Every Kubernetes manifest in ``infra/k8s/`` (and the Job the Prefect work pool's base job
  template renders) is valid against the Kubernetes schemas bundled with kubernetes-validate,
  strictly (an unknown field is an error); the ``DaskCluster`` resource against the openAPI
  schema of the Dask operator's CRD, vendored in ``infra/k8s/crds/``, made strict the same way.
* Nothing needs a shared volume (no PersistentVolumeClaim, no ReadWriteMany).
* Every command a manifest runs in the pipeline's image exists there: the console scripts the
  image installs, ``dask scheduler`` / ``dask worker`` and each option given to them, the worker
  preload, the flow-run command of the Prefect jobs; the names that tie the files together
  (Secret, scheduler Service, work pool, job variables, flow parameters) agree.
* ``infra/Dockerfile`` copies files that exist, installs with the same pin file as
  ``make install`` on the same Python, and compiles the kernels at build time.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata as md
import inspect
import json
import re
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
K8S = INFRA / "k8s"
K8S_VERSION = "1.37.0"
IMAGE = "dpmm-pipeline"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file, resource) of every document of infra/k8s/*.yaml."""
    out = []
    for f in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc is not None:
                out.append((f.name, doc))
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [r for _, r in manifests() if r["kind"] == kind]


def strict(schema: Any) -> Any:
    """A copy of a CRD openAPI schema in which an object with listed properties admits no
    others (the API server would prune them silently: a typo would go unnoticed)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schema(kind: str) -> dict[str, Any]:
    for f in sorted((K8S / "crds").glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v.get("served", True)]
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            # apiVersion, kind and metadata are the API server's, outside the CRD's schema
            schema["properties"].update(
                apiVersion={"const": f"{crd['spec']['group']}/{version['name']}"},
                kind={"const": kind},
                metadata={"type": "object"},
            )
            schema.setdefault("required", []).extend(["apiVersion", "kind", "metadata"])
            return strict(schema)  # type: ignore[no-any-return]
    raise AssertionError(f"no vendored CRD of kind {kind}")


def validate(resource: dict[str, Any]) -> None:
    """Raise if ``resource`` is not valid (jsonschema / kubernetes-validate errors)."""
    if resource["apiVersion"].startswith("kubernetes.dask.org/"):
        jsonschema.validate(resource, crd_schema(resource["kind"]))
    else:
        kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


# -- the Prefect work pool's Job -------------------------------------------------------------
def work_pool() -> dict[str, Any]:
    return json.loads((K8S / "work-pool.json").read_text())  # type: ignore[no-any-return]


def rendered_job(job_variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Job a Prefect Kubernetes worker submits for a flow run: the base job template with
    the variables' defaults and ``job_variables`` filled in (``prefect.utilities.templating``),
    then what the worker adds itself (prefect-kubernetes' ``_populate_command_if_not_present``,
    env as a list)."""
    from prefect.utilities.templating import apply_values

    pool = work_pool()
    props = pool["variables"]["properties"]
    values = {k: v["default"] for k, v in props.items() if "default" in v}
    values.update(name="dpmm-cluster-run", labels={"prefect.io/flow-run-id": "1234"}, env={})
    values.update(job_variables or {})
    job = apply_values(copy.deepcopy(pool["job_configuration"]["job_manifest"]), values)
    container = job["spec"]["template"]["spec"]["containers"][0]
    if container.get("args") is None:
        container["args"] = ["prefect", "flow-run", "execute"]
    container["env"] = [{"name": k, "value": str(v)} for k, v in (container["env"] or {}).items()]
    return job  # type: ignore[no-any-return]


def all_resources() -> list[tuple[str, dict[str, Any]]]:
    return [*manifests(), ("work-pool.json (rendered Job)", rendered_job())]


@pytest.mark.parametrize(("name", "resource"), all_resources(), ids=lambda v: str(v)[:40])
def test_every_manifest_is_valid(name: str, resource: dict[str, Any]):
    validate(resource)


def test_the_validation_catches_mistakes():
    """Not vacuous: a misspelt field, a wrong type or a missing required field fails."""
    (cluster,) = by_kind("DaskCluster")
    bad = copy.deepcopy(cluster)
    bad["spec"]["worker"]["replica"] = bad["spec"]["worker"].pop("replicas")
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(cluster)
    bad["spec"]["worker"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8788"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(cluster)
    del bad["spec"]["scheduler"]["service"]
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    job = rendered_job()
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)
    job = rendered_job()
    job["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["secretRefs"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)


def test_no_shared_volume():
    for f in [*K8S.glob("*"), INFRA / "prefect.yaml", INFRA / "Dockerfile"]:
        if f.is_file():
            text = f.read_text()
            for word in ("ReadWriteMany", "persistentVolumeClaim", "PersistentVolumeClaim"):
                assert word not in text, f"{f.name} uses {word}"
            shared = re.search(r"(^|[\s\"':=])/data\b", text, re.M)
            assert not shared, f"{f.name} still names the shared volume /data"
    for _, r in all_resources():
        for pod in pod_specs(r):
            assert not pod.get("volumes"), r["metadata"]


# -- the commands run in the image -----------------------------------------------------------
def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of infra/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (INFRA / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def exec_form(rest: str) -> list[str] | None:
    return json.loads(rest) if rest.startswith("[") else None


def image_argv(container: dict[str, Any]) -> list[str]:
    """What a container of the pipeline's image runs, by Kubernetes' rules: ``command``
    replaces the image's ENTRYPOINT, ``args`` its CMD (and CMD is dropped with ``command``)."""
    entry: list[str] = []
    cmd: list[str] = []
    for word, rest in dockerfile():
        if word == "ENTRYPOINT":
            entry = exec_form(rest) or []
        elif word == "CMD":
            cmd = exec_form(rest) or []
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    return [*entry, *container.get("args", cmd)]


def pod_specs(resource: dict[str, Any]) -> list[dict[str, Any]]:
    spec = resource.get("spec", {})
    if resource["kind"] == "DaskCluster":
        return [spec["scheduler"]["spec"], spec["worker"]["spec"]]
    if "template" in spec:
        return [spec["template"]["spec"]]
    return []


def image_containers() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, r in all_resources():
        for pod in pod_specs(r):
            for c in pod["containers"]:
                if c["image"].split(":")[0] == IMAGE:
                    out.append((f"{name}/{c['name']}", c))
    return out


def console_scripts() -> dict[str, str]:
    return {ep.name: ep.value for ep in md.entry_points(group="console_scripts")}


def click_options(command: Any) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


def check_dask(argv: list[str], where: str) -> None:
    sub = {ep.name: ep for ep in md.entry_points(group="dask_cli")}
    assert argv[1] in sub, f"{where}: 'dask {argv[1]}' is not a dask command ({sorted(sub)})"
    command = sub[argv[1]].load()
    known = click_options(command)
    for word in argv[2:]:
        if word.startswith("--"):
            assert word.split("=")[0] in known, f"{where}: dask {argv[1]} has no option {word}"
    if "--preload" in argv:
        module = importlib.import_module(argv[argv.index("--preload") + 1])
        assert callable(getattr(module, "dask_setup", None)), f"{where}: preload has no dask_setup"


def check_prefect(argv: list[str], where: str) -> None:
    assert argv[1:3] == ["flow-run", "execute"], f"{where}: {argv}"
    from prefect.cli import flow_run

    assert inspect.iscoroutinefunction(inspect.unwrap(flow_run.execute)), where


def test_the_images_entry_points_exist():
    scripts = console_scripts()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # the image installs the project: its own scripts plus those of its dependencies
    assert project["scripts"]["dpmm"] == scripts["dpmm"]
    seen = set()
    containers = image_containers()
    assert len(containers) >= 3, containers  # scheduler, worker, flow-run job
    for where, container in containers:
        argv = image_argv(container)
        assert argv, f"{where}: runs nothing"
        assert argv[0] in scripts, f"{where}: {argv[0]!r} is not a command of the image"
        seen.add(argv[0] if argv[0] != "dask" else f"dask {argv[1]}")
        if argv[0] == "dask":
            check_dask(argv, where)
        elif argv[0] == "prefect":
            check_prefect(argv, where)
    assert {"dask scheduler", "dask worker", "prefect"} <= seen, seen
    # the image's default command is the CLI
    (cmd,) = [exec_form(rest) for word, rest in dockerfile() if word == "CMD"]
    assert cmd is not None and cmd[0] in scripts and scripts[cmd[0]] == "flows.cli:main"


def test_the_files_agree_with_each_other():
    (cluster,) = by_kind("DaskCluster")
    secrets = {s["metadata"]["name"] for s in by_kind("Secret")}
    # the Secret the workers and the flow-run jobs read is one of the manifests
    for where, c in image_containers():
        if "worker" in where or "prefect-job" in where:
            refs = {e["secretRef"]["name"] for e in c.get("envFrom", [])}
            assert refs and refs <= secrets, (where, refs, secrets)
    # the network policy admits the cluster's pods and the flow-run jobs, nothing else
    (policy,) = by_kind("NetworkPolicy")
    name = cluster["metadata"]["name"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"dask.org/cluster-name": name}
    allowed = [f["podSelector"]["matchLabels"] for f in policy["spec"]["ingress"][0]["from"]]
    job_labels = rendered_job()["spec"]["template"]["metadata"]["labels"]
    assert allowed[0] == {"dask.org/cluster-name": name}
    assert allowed[1].items() <= job_labels.items(), (allowed, job_labels)
    # the scheduler the deployments join is the operator's Service of this DaskCluster
    scheduler = f"tcp://{cluster['metadata']['name']}-scheduler:8786"
    doc = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    pool_vars = set(work_pool()["variables"]["properties"])
    (worker,) = [d for d in by_kind("Deployment") if "prefect" in d["metadata"]["name"]]
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    pool_name = args[args.index("--pool") + 1]
    image = worker["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.split(":")[1].startswith(md.version("prefect") + "-"), image
    assert doc["prefect-version"] == md.version("prefect")
    from prefect.flows import load_flow_from_entrypoint

    for dep in doc["deployments"]:
        assert dep["parameters"]["scheduler"] == scheduler, dep["name"]
        assert dep["work_pool"]["name"] == pool_name, dep["name"]
        jv = dep["work_pool"]["job_variables"]
        assert set(jv) <= pool_vars, (dep["name"], set(jv) - pool_vars)
        validate(rendered_job(jv))
        path, name = dep["entrypoint"].split(":")
        flow = load_flow_from_entrypoint(f"{REPO / path}:{name}")
        assert set(dep["parameters"]) <= set(inspect.signature(flow.fn).parameters), dep["name"]
        for key in ("input", "out", "models", "scores", "data_dir"):
            if key in dep["parameters"]:
                assert str(dep["parameters"][key]).startswith("s3://"), (dep["name"], key)


# -- the Dockerfile --------------------------------------------------------------------------
def test_dockerfile_builds_the_make_install_environment():
    steps = dockerfile()
    (base,) = [rest for word, rest in steps if word == "FROM"]
    assert base.startswith(f"python:{sys.version_info.major}.{sys.version_info.minor}-"), base
    for word, rest in steps:
        if word == "COPY":
            *sources, _dest = shlex.split(rest)
            for s in sources:
                assert (REPO / s).exists(), f"COPY {s}: no such file in the repository"
    runs = [rest for word, rest in steps if word == "RUN"]
    makefile = (REPO / "Makefile").read_text()
    install = [ln for ln in makefile.splitlines() if "pip install" in ln and "-e '.[dev]'" in ln]
    pins = {m for ln in install for m in re.findall(r"-c (\S+)", ln)}
    assert pins == {"requirements.lock"}, install
    assert any(re.search(r"pip install -c requirements\.lock \.(\s|$)", r) for r in runs), runs
    # the pins cover every dependency, and are what this environment has installed
    lock = {}
    for ln in (REPO / "requirements.lock").read_text().splitlines():
        if ln and not ln.startswith("#"):
            name, _, version = ln.partition("==")
            lock[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for req in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[ ;]", req)[0]).lower()
        assert name in lock, f"{req}: not pinned in requirements.lock (run 'make lock')"
        assert md.version(name) == lock[name], (
            f"{name}: installed {md.version(name)}, pinned {lock[name]}"
        )
    # the kernels are compiled at build time by `dpmm warm --portable`, for any CPU the image
    # runs on: the in-memory fits and the workers' own warm-up for every engine and spec type
    assert any(shlex.split(r)[:3] == ["dpmm", "warm", "--portable"] for r in runs), runs
    from flows.cli import warm
    from pipeline.distributed import worker_setup

    # every engine and spec type, and stage 2's tree-guided MCMC (``pipeline.ops.stage2``)
    assert "import warm_kernels as w; " in warm._WARM
    assert "w(every_product=True, more_stage2=[MCMC_STEP])" in warm._WARM
    assert inspect.signature(worker_setup.warm_kernels).parameters["names"].default is None
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert "NUMBA_CACHE_DIR=" in env


def test_the_gpu_workers_ask_for_one_gpu_each_and_join_the_scheduler():
    """infra/k8s/dask-gpu-workers.yaml: one worker process per pod and one card per pod (a
    limit), on GPU nodes, joining the DaskCluster's scheduler Service, allowed by the
    NetworkPolicy, in the image built with the GPU extra."""
    (cluster,) = by_kind("DaskCluster")
    (gpu,) = [d for d in by_kind("Deployment") if d["metadata"]["name"] == "dpmm-gpu-worker"]
    pod = gpu["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    res = container["resources"]
    assert res["limits"]["nvidia.com/gpu"] == 1 == res["requests"]["nvidia.com/gpu"]
    args = image_argv(container)
    assert args[args.index("--nworkers") + 1] == "1"
    assert f"tcp://{cluster['metadata']['name']}-scheduler:8786" in args
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    (policy,) = by_kind("NetworkPolicy")
    allowed = policy["spec"]["podSelector"]["matchLabels"].items()
    assert allowed <= gpu["spec"]["template"]["metadata"]["labels"].items()
    # the image with the GPU extra: the Dockerfile's build argument installs it
    assert container["image"] == f"{IMAGE}:gpu"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    gpu_extra = {re.split(r"[<>=!~\[ ;]", r)[0] for r in project["optional-dependencies"]["gpu"]}
    assert {"numba-cuda", "cupy-cuda12x", "dask-cuda"} <= gpu_extra
    assert any("pip install '.[gpu]'" in rest for word, rest in dockerfile() if word == "RUN")
