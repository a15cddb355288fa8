# SPDX-License-Identifier: Apache-2.0 OR MIT
"""Policy for deploy/*.yaml, run by deploy/check: the DaemonSet keeps the
least privileges README's Kubernetes section documents. Prints one line and
exits 1 on the first violation."""
import ipaddress
import re
import sys
from pathlib import Path

import yaml

# Documented, with a reason each, in daemonset.yaml next to `add:`.
CAPS = {"BPF", "PERFMON", "SYS_RESOURCE", "SYSLOG", "SYS_PTRACE", "DAC_READ_SEARCH", "CHECKPOINT_RESTORE"}
# Host paths sonde may see, all read-only.
HOST_PATHS = {"/sys/fs/cgroup", "/sys/kernel/btf", "/sys/kernel/tracing"}
HERE = Path(__file__).resolve().parent


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def flag(args, name):
    """The value of --name=V or --name V in a container's args (None if absent)."""
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def host_port(addr):
    """("127.0.0.1", 9632) from "127.0.0.1:9632" or "[::1]:9632"."""
    m = re.fullmatch(r"\[?([^\]]*)\]?:(\d+)", addr or "")
    need(m, f"cannot parse address {addr!r}")
    return m.group(1), int(m.group(2))


def probe_port(probe):
    return (probe or {}).get("httpGet", {}).get("port")


def check(files):
    docs = []
    for f in files:
        with open(f) as fh:
            docs += [(f, d) for d in yaml.safe_load_all(fh) if d]
    kinds = {(d["kind"], d["metadata"]["name"]): (f, d) for f, d in docs}
    need(("Namespace", "sonde") in kinds, "no Namespace sonde")
    ns = kinds[("Namespace", "sonde")][1]
    need(
        ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") == "privileged",
        "namespace sonde: pod-security.kubernetes.io/enforce must be privileged (hostPID, hostPath, capabilities)",
    )
    need(("DaemonSet", "sonde") in kinds, "no DaemonSet sonde")
    ds_file, ds = kinds[("DaemonSet", "sonde")]
    pod = ds["spec"]["template"]["spec"]
    need(pod.get("hostNetwork", False) is False, "hostNetwork must be false")
    need(pod.get("hostIPC", False) is False, "hostIPC must be false")
    need(pod.get("hostPID") is True, "hostPID must be true (symbols and unwind tables of every process)")
    need(pod.get("automountServiceAccountToken") is False, "automountServiceAccountToken must be false (token for the sidecar only)")
    need(pod.get("priorityClassName") == "system-node-critical", "priorityClassName must be system-node-critical")
    need(any(t.get("operator") == "Exists" for t in pod.get("tolerations", [])), "tolerations: need operator Exists")
    need(not pod.get("initContainers") and not pod.get("ephemeralContainers"), "no init or ephemeral containers expected")

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        if "hostPath" in v:
            need(v["hostPath"]["path"] in HOST_PATHS, f"hostPath {v['hostPath']['path']} not in {sorted(HOST_PATHS)}")

    containers = {c["name"]: c for c in pod["containers"]}
    need(set(containers) == {"sonde", "kube-rbac-proxy"}, f"containers {sorted(containers)}: want sonde and kube-rbac-proxy")
    for name, c in containers.items():
        sc = c.get("securityContext", {})
        need(sc.get("privileged", False) is False, f"{name}: privileged")
        need(sc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation must be false")
        need(sc.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem must be true")
        need(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities.drop must be [ALL]")
        need(sc.get("procMount", "Default") == "Default", f"{name}: procMount must be Default")
        need(c.get("livenessProbe") and c.get("readinessProbe"), f"{name}: liveness and readiness probes required")
        res = c.get("resources", {})
        need(res.get("requests") and res.get("limits", {}).get("memory"), f"{name}: resource requests and a memory limit required")
        for p in c.get("ports", []):
            need("hostPort" not in p, f"{name}: hostPort {p.get('hostPort')}")
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"])
            need(v is not None, f"{name}: mount of unknown volume {m['name']}")
            if "hostPath" in v:
                need(m.get("readOnly") is True, f"{name}: host mount {m['mountPath']} must be readOnly")
                need(m.get("mountPropagation", "None") in ("None", "HostToContainer"), f"{name}: {m['mountPath']} propagation")

    sonde = containers["sonde"]
    sc = sonde["securityContext"]
    added = sc.get("capabilities", {}).get("add", [])
    need(len(added) == len(set(added)), f"sonde: duplicate capabilities {added}")
    need(set(added) == CAPS, f"sonde: capabilities.add {sorted(added)} != documented {sorted(CAPS)}")
    text = Path(ds_file).read_text()
    for cap in CAPS:
        need(re.search(rf"^\s*#\s+{cap}:", text, re.M), f"sonde: capability {cap} has no '# {cap}: why' comment in {ds_file}")
    need(not any(m["name"] == "kube-api-access" for m in sonde.get("volumeMounts", [])), "sonde: must not mount the API token")

    args = sonde.get("args", [])
    need(args[:1] == ["serve"], f"sonde: args {args} must start with serve")
    host, port = host_port(flag(args, "--listen"))
    need(ipaddress.ip_address(host).is_loopback, f"sonde: --listen {host}:{port} is not a loopback address")
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        if kind in sonde:
            g = sonde[kind].get("httpGet", {})
            need(g.get("path") == "/-/healthy", f"sonde: {kind} path must be /-/healthy")
            need(g.get("port") == port and g.get("scheme") == "HTTPS", f"sonde: {kind} must be HTTPS on {port} (the sidecar)")

    proxy = containers["kube-rbac-proxy"]
    pa = proxy.get("args", [])
    need(not proxy["securityContext"]["capabilities"].get("add"), "kube-rbac-proxy: no capabilities to add")
    need(proxy["securityContext"].get("runAsNonRoot") is True, "kube-rbac-proxy: runAsNonRoot must be true")
    lhost, lport = host_port(flag(pa, "--secure-listen-address"))
    need(lhost == "$(POD_IP)" and lport == port, f"kube-rbac-proxy: --secure-listen-address must be [$(POD_IP)]:{port}")
    need(flag(pa, "--upstream") == f"http://127.0.0.1:{port}/", f"kube-rbac-proxy: --upstream must be http://127.0.0.1:{port}/")
    need(
        flag(pa, "--ignore-paths") == "/-/healthy",
        "kube-rbac-proxy: --ignore-paths must be exactly /-/healthy (every other path needs authorization)",
    )
    need(flag(pa, "--allow-paths") is None, "kube-rbac-proxy: --allow-paths cannot be combined with --ignore-paths")
    need(
        any(p.get("name") == "https" and p.get("containerPort") == port for p in proxy.get("ports", [])),
        f"kube-rbac-proxy: port https must be {port}",
    )
    ep = int(flag(pa, "--proxy-endpoints-port") or 0)
    need(probe_port(proxy.get("livenessProbe")) == ep != 0, "kube-rbac-proxy: liveness must probe --proxy-endpoints-port")

    # The scrape snippet must point at the same port.
    scrape = yaml.safe_load((HERE / "prometheus-scrape.yml").read_text())
    for job in scrape["scrape_configs"]:
        for sc_ in job.get("static_configs", []):
            for t in sc_["targets"]:
                need(t.endswith(f":{port}"), f"prometheus-scrape.yml: job {job['job_name']} target {t} is not on port {port}")
    return f"sonde listens on {host}:{port}, capabilities {len(CAPS)}"


def main():
    try:
        check(sys.argv[1:])
    except Bad as e:
        print(f"deploy/check: policy: {e}", file=sys.stderr)
        sys.exit(1)
    except (KeyError, TypeError, ValueError) as e:
        print(f"deploy/check: policy: unexpected manifest shape ({type(e).__name__}: {e})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
