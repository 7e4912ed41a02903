"""The Kubernetes manifests in docs/kubernetes/: the app as a 3-replica cluster, kernel pods
rendered from the kernelspec's template with what the app really sends (presigned files by
default, the shared volume as the alternative), locked down, with egress only to the gateway,
DNS and the object store."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import msgspec

from datadesk.settings import SandboxSettings

TOKEN = "gw-proposed-token-0123456789"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes"


def _manifests() -> list[dict]:
    import yaml  # pyyaml and jinja2 come with jupyter-kernel-gateway (the test extra)

    docs = []
    for path in sorted(DOCS.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _find(docs: list[dict], kind: str, name: str) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _render_pod(docs: list[dict], sb: SandboxSettings, home: Path, cluster: bool, tmp_path: Path) -> dict:
    """30-kernelspec.yaml's template rendered as Enterprise Gateway's launcher does (KERNEL_*
    variables lower-cased, values read as YAML) with what the app sends for settings `sb`."""
    import jinja2
    import yaml
    from datadesk.sandbox.base import KernelPlacement
    from datadesk.sandbox.backends.gateway.remote import GatewayKernel, GatewaySandbox

    sandbox = GatewaySandbox(sb, home, cluster)  # checks the settings; touches no file
    slot = home / "sandbox" / "slots" / "k0123456789"
    kernel = GatewayKernel(KernelPlacement("k0123456789", slot / "data", slot / "outputs", tmp_path), sandbox)
    kernel.kernel_data, kernel.kernel_outputs = kernel._kernel_dirs()
    env = kernel._env()
    assert TOKEN not in json.dumps(env) and "x" * 16 not in json.dumps(env)
    spec = _find(docs, "ConfigMap", "datadesk-kernelspec")["data"]
    kernel_json = json.loads(spec["kernel.json"])
    assert kernel_json["metadata"]["process_proxy"]["class_name"].endswith("KubernetesProcessProxy")
    keywords = {k.lower(): yaml.safe_load(v) for k, v in env.items()}
    keywords.update(kernel_id="5e755458-a114", kernel_pod_name="datadesk-5e755458-a114",
                    kernel_image=kernel_json["metadata"]["process_proxy"]["config"]["image_name"])
    return yaml.safe_load(jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
                          .from_string(spec["kernel-pod.yaml.j2"]).render(**keywords))


def _assert_locked_down(pod: dict) -> tuple[dict, dict, dict]:
    assert pod["metadata"]["namespace"] == "datadesk-kernels"
    ps = pod["spec"]
    assert ps["automountServiceAccountToken"] is False and ps["serviceAccountName"] == "datadesk-kernel"
    assert ps["securityContext"]["runAsNonRoot"] is True and ps["securityContext"]["runAsUser"] == 1000
    (c,) = ps["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged")
    assert {"cpu", "memory"} <= set(c["resources"]["limits"]) and {"cpu", "memory"} <= set(c["resources"]["requests"])
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in ps["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    return c, mounts, volumes


def test_the_kernel_pod_template_renders_presigned_with_what_the_cluster_app_sends(tmp_path: Path) -> None:
    """The app of 60-datadesk-app.yaml (cluster set, no shared dir): /data and /outputs are sized
    emptyDirs of the pod, no volume of the app's is mounted."""
    docs = _manifests()
    app_toml = tomllib.loads(_find(docs, "ConfigMap", "datadesk-config")["data"]["datadesk.toml"])
    assert "gateway_shared_dir" not in app_toml["sandbox"]
    sb = msgspec.convert({**app_toml["sandbox"], "gateway_token": "x" * 16}, SandboxSettings)
    pod = _render_pod(docs, sb, tmp_path / "home", True, tmp_path)
    c, mounts, volumes = _assert_locked_down(pod)
    assert c["workingDir"] == "/outputs"
    for path in ("/data", "/outputs"):
        vol = volumes[mounts[path]["name"]]
        assert "emptyDir" in vol and vol["emptyDir"].get("sizeLimit"), (path, vol)
    assert not any("persistentVolumeClaim" in v for v in volumes.values()), volumes
    assert c["resources"]["limits"]["ephemeral-storage"]


def test_the_kernel_pod_template_renders_volume_mode_with_the_slot_only(tmp_path: Path) -> None:
    """sandbox.gateway_files = "volume" (10-storage.yaml): only the kernel's slot, data read-only."""
    docs = _manifests()
    app_toml = tomllib.loads(_find(docs, "ConfigMap", "datadesk-config")["data"]["datadesk.toml"])
    sb = msgspec.convert({**app_toml["sandbox"], "gateway_token": "x" * 16, "gateway_files": "volume",
                          "gateway_shared_dir": "/srv/datadesk", "gateway_kernel_shared_dir": "/mnt/datadesk"},
                         SandboxSettings)
    pod = _render_pod(docs, sb, Path("/srv/datadesk"), False, tmp_path)
    c, mounts, volumes = _assert_locked_down(pod)
    data = mounts["/mnt/datadesk/sandbox/slots/k0123456789/data"]
    assert data["subPath"] == "sandbox/slots/k0123456789/data" and data["readOnly"] is True
    assert mounts["/data"]["readOnly"] is True and not mounts["/outputs"].get("readOnly")
    assert mounts["/mnt/datadesk/sandbox/slots/k0123456789/outputs"]["subPath"] == "sandbox/slots/k0123456789/outputs"
    assert c["workingDir"] == "/mnt/datadesk/sandbox/slots/k0123456789/outputs"
    assert volumes["datadesk-home"]["persistentVolumeClaim"]["claimName"] == "datadesk-home"


def test_kernels_have_no_api_token_no_rbac_and_egress_only_to_gateway_dns_and_store() -> None:
    docs = _manifests()
    sa = _find(docs, "ServiceAccount", "datadesk-kernel")
    assert sa["automountServiceAccountToken"] is False
    bound = [s for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in d["subjects"]]
    assert all(s["name"] != "datadesk-kernel" for s in bound)
    ns = _find(docs, "Namespace", "datadesk-kernels")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    policy = _find(docs, "NetworkPolicy", "kernels-deny-all")
    assert policy["metadata"]["namespace"] == "datadesk-kernels" and policy["spec"]["podSelector"] == {}
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    # the ways out: the launcher's report to the gateway, DNS to the cluster's DNS pods, and the one
    # loosening: the object store's S3 port (presigned URLs); each rule one peer, no ipBlock
    gateway, dns, store = policy["spec"]["egress"]
    assert [p["port"] for p in gateway["ports"]] == [8877]
    assert gateway["to"][0]["podSelector"]["matchLabels"]["app"] == "enterprise-gateway"
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert [p["port"] for p in store["ports"]] == [8333]
    assert store["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "objects"}
    for rule in (gateway, dns, store):
        assert len(rule["to"]) == 1 and "ipBlock" not in rule["to"][0], rule
    (inbound,) = policy["spec"]["ingress"]
    assert inbound["from"][0]["podSelector"]["matchLabels"]["component"] == "enterprise-gateway"
    gw = _find(docs, "Deployment", "enterprise-gateway")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in gw["env"]}
    assert "secretKeyRef" in env["EG_AUTH_TOKEN"]["valueFrom"]
    assert json.loads(env["EG_ALLOWED_KERNELS"]["value"]) == ["datadesk-python"]
    assert env["EG_LIST_KERNELS"]["value"] == "False"
    assert not [e for e in env.values() if e["name"].startswith(("AWS_", "DATADESK_"))], "no app secret in the gateway"


def test_the_app_is_three_replicas_with_its_secrets_from_secrets_and_probes() -> None:
    docs = _manifests()
    app = _find(docs, "Deployment", "datadesk")["spec"]
    assert app["replicas"] == 3
    (c,) = app["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    for name in ("DATADESK_CLUSTER_DATABASE_URL", "DATADESK_STORAGE_URL", "DATADESK_STORAGE_ENDPOINT",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DATADESK_SECRET_KEY", "DATADESK_METRICS_TOKEN",
                 "DATADESK_GATEWAY_TOKEN"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
    assert c["readinessProbe"]["httpGet"]["path"] == "/api/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/api/health"
    volumes = {v["name"]: v for v in app["template"]["spec"]["volumes"]}
    home = next(m for m in c["volumeMounts"] if m["mountPath"] == env["DATADESK_HOME"]["value"])
    assert "emptyDir" in volumes[home["name"]], "each pod's home is its own cache"
    assert _find(docs, "Service", "datadesk")["spec"]["selector"] == app["selector"]["matchLabels"]
