"""Adapts the chart's Postgres-mode rendering (on stdin) for `podman kube play`, the nearest
thing to a cluster this machine has, and writes it to stdout. podman 4.3 cannot give a
container a Secret's key (secretKeyRef: "secret … is not valid JSON"), so the secrets
become literal values; it allows no port mappings with host networking (which the pod
needs to reach the host's Postgres on 127.0.0.1), so the ports go and the listeners bind
127.0.0.1 on the ports given. What stays as rendered: the ConfigMap and its mount, the
node id from the pod's name (downward API), the probes, the securityContext, the volumes.

    kube-play.py ADMIN_TOKEN DATABASE_URL API_PORT ADMIN_PORT < rendered.yaml
"""
import sys, yaml
token, url, api, admin = sys.argv[1:5]
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
keep = []
for d in docs:
    if d["kind"] == "ConfigMap" and "herald.toml" in d["data"]:
        keep.append(d)
    if d["kind"] == "Deployment":
        c = d["spec"]["template"]["spec"]["containers"][0]
        literal = {"HERALD_SERVER_ADMIN_TOKEN": token, "HERALD_STORE_URL": url,
                   "HERALD_SERVER_LISTEN": f"127.0.0.1:{api}", "HERALD_SERVER_ADMIN_LISTEN": f"127.0.0.1:{admin}"}
        env = []
        for e in c["env"]:
            if e["name"] in literal:
                env.append({"name": e["name"], "value": literal[e["name"]]})
            elif "secretKeyRef" in e.get("valueFrom", {}):
                continue
            else:
                env.append(e)
        c["env"] = env
        # Host networking (to reach the host's Postgres on 127.0.0.1) allows no port mappings.
        c.pop("ports", None)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            c[probe]["httpGet"]["port"] = int(admin)
        keep.append(d)
yaml.safe_dump_all(keep, sys.stdout)
