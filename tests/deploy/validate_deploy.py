#!/usr/bin/env python3
"""Validates the deployment artifacts under deploy/.

Static checks (ctest deploy_configs_parse):
  * every deploy/ghz/*.json and deploy/grafana/*.json is JSON, every
    deploy/k8s/*.yaml, deploy/docker-compose.yml, deploy/prometheus/*.yml and
    Grafana provisioning file is YAML;
  * Kubernetes: apiVersion/kind/metadata.name on every document; selectors
    match pod labels; mounts name declared volumes; the kvmem-server
    containers' settings (their --config ConfigMap's TOML, then their args)
    are consistent with their volumes, ports, probes and annotations: the
    sidecar's containers share the emptyDir holding the unix socket, the
    StatefulSet's --data_dir is a volumeClaimTemplate, the gRPC probes use the
    listen port and the service kvmem.v1.KvMemory, exec probes run real
    `kvmem` subcommands and flags against the socket; the nginx proxy config
    hashes on kvmem-stream-id consistently and never fails over;
  * the ConfigMaps' TOML parses (tomllib); its [server] keys are flags that
    kvmem-server defines in server/ (from `kvmem-server --helpfull`), with
    values of the flag's type, and the server itself accepts the file when it
    has --print_config;
  * docker-compose: three kvmem services from the root Dockerfile with their
    own volumes, --metrics_listen and --instance_name, nginx in front, the
    cameras client through nginx, Prometheus scraping every instance;
  * Grafana: every metric and label the dashboard's PromQL uses is in
    deploy/grafana/metrics.txt (with the label and type rules its header
    states), every variable it references is defined;
  * ghz: each config's "data", with ghz's template actions substituted,
    parses into the call's request message (protoc --python_out), and is
    valid for the server: payload sizes match the stream geometry, query
    lengths its summary_dim, frame indices run 0, 1, 2... over repeated
    calls, metadata kvmem-stream-id names the call's stream.

Live check (--live, ctest deploy_ghz_configs_live): starts kvmem-server on a
scratch directory (or uses --live-addr), creates demo-cam-0 with `kvmem demo`,
and runs each ghz config's calls the way ghz would (python3-grpcio), checking
every call succeeds; then checks the server's /metrics against metrics.txt:
every name served, with the type and labels the rules give.

Exit status: 0 passed, 1 failed, 77 skipped (live check without grpcio).
"""

import argparse
import base64
import glob
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid

import yaml

SKIP = 77

# [stream_defaults] keys kvmem-server's config file takes, as its
# --print_config listed them when this was written (with a server binary that
# has --print_config, its output is the list instead).
STREAM_DEFAULT_KEYS = {k: float for k in (
    "hot_window_tokens", "frames_per_block", "shot_similarity_threshold",
    "max_tokens_per_block", "groups_per_block", "default_top_k",
    "default_max_tokens", "gate_temperature", "warm_budget_bytes",
    "cold_budget_bytes", "storage_cap_bytes", "heat_half_life_frames",
    "prefetch_blocks", "stage_budget_bytes", "rebuild_every_blocks",
    "rebuild_every_seconds")}
STREAM_DEFAULT_KEYS.update({k: str for k in (
    "segment_mode", "index_factory", "replacement", "cold_precision")})

# Keys of a ghz JSON config (ghz runner.Config and its CLI flags).
GHZ_KEYS = {
    "proto", "protoset", "call", "cacert", "cert", "key", "skipTLS", "cname",
    "authority", "insecure", "total", "concurrency", "connections", "qps",
    "rps", "duration", "duration-stop", "max-duration", "timeout", "data",
    "data-file", "binary-file", "metadata", "metadata-file",
    "stream-interval", "stream-call-duration", "stream-call-count",
    "stream-dynamic-messages", "reflect-metadata", "output", "format",
    "connect-timeout", "keepalive", "cpus", "import-paths", "name", "tags",
    "debug", "host", "enable-compression", "async", "skipFirst",
    "count-errors", "lb-strategy", "load-schedule", "load-start",
    "load-step", "load-end", "load-step-duration", "load-max-duration",
    "concurrency-schedule", "concurrency-start", "concurrency-step",
    "concurrency-end", "concurrency-step-duration",
    "concurrency-max-duration", "max-recv-message-size",
    "max-send-message-size", "disable-template-functions",
    "disable-template-data",
}

# ghz call template data this script can substitute.
GHZ_TEMPLATE = re.compile(r"\{\{\s*\.(RequestNumber|UUID|WorkerID|Timestamp|"
                          r"TimestampUnix|TimestampUnixMilli|TimestampUnixNano|"
                          r"MethodName|ServiceName|FullyQualifiedName|InputName|"
                          r"OutputName)\s*\}\}")

STREAM_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
DTYPE_BYTES = {"DTYPE_FP16": 2, "DTYPE_BF16": 2, "DTYPE_FP32": 4, 1: 2, 2: 2, 3: 4}
PROMETHEUS_TARGET_LABELS = {"instance", "job"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Pod", "Job"}


class Report:
    def __init__(self):
        self.errors = []
        self.notes = []
        self.checks = 0

    def check(self, cond, where, msg):
        self.checks += 1
        if not cond and f"{where}: {msg}" not in self.errors:
            self.errors.append(f"{where}: {msg}")
        return bool(cond)

    def error(self, where, msg):
        self.check(False, where, msg)

    def note(self, msg):
        self.notes.append(msg)


R = Report()


# ---------------------------------------------------------------- binaries --

def parse_helpfull(text):
    """absl --helpfull output -> {flag: {"section": file, "default": str}}."""
    flags = {}
    section = ""
    cur = None
    for line in text.splitlines():
        m = re.match(r"^\s*Flags from (.+):\s*$", line)
        if m:
            section, cur = m.group(1), None
            continue
        m = re.match(r"^\s{2,}--([A-Za-z0-9_]+) \((.*)$", line)
        if m:
            cur = m.group(1)
            flags[cur] = {"section": section, "text": m.group(2)}
            continue
        if cur and line.startswith("      "):
            flags[cur]["text"] += " " + line.strip()
        else:
            cur = None
    for f in flags.values():
        m = re.search(r"default: (.*);\s*$", f["text"])
        f["default"] = m.group(1) if m else None
    return flags


def flag_type(default):
    if default is None:
        return None
    if default.startswith('"'):
        return str
    if default in ("true", "false"):
        return bool
    if re.fullmatch(r"-?\d+", default):
        return int
    if re.fullmatch(r"-?[\d.]+(e[-+]?\d+)?", default):
        return float
    return None


class Binaries:
    def __init__(self, server, cli):
        self.server = os.path.abspath(server) if server else None
        self.cli = os.path.abspath(cli) if cli else None
        server, cli = self.server, self.cli
        self.server_flags = None       # all flags kvmem-server accepts
        self.server_own_flags = None   # those defined in server/ (config file keys)
        self.print_config = False
        self.cli_flags = None
        self.cli_commands = None
        self.stream_default_keys = dict(STREAM_DEFAULT_KEYS)
        if server:
            out = run_capture([server, "--helpfull"])
            self.server_flags = parse_helpfull(out)
            R.check(self.server_flags, server, "--helpfull listed no flags")
            self.server_own_flags = {
                k: v for k, v in self.server_flags.items()
                if re.search(r"(^|/)server/", v["section"])}
            self.print_config = "print_config" in self.server_flags
            if self.print_config:
                self.stream_default_keys = self.read_stream_defaults(server)
        else:
            R.note("no --server-binary: kvmem-server flag names not checked")
        if cli:
            out = run_capture([cli, "--helpfull"])
            self.cli_flags = parse_helpfull(out)
            # `kvmem --help` lists one subcommand per line: "  demo      ...".
            self.cli_commands = set(re.findall(
                r"^  ([a-z]+) {2,}\S", run_capture([cli, "--help"]), re.M))
            R.check(self.cli_commands, cli, "--help lists no subcommands")
        else:
            R.note("no --cli-binary: kvmem CLI flags not checked")

    @staticmethod
    def read_stream_defaults(server):
        """[stream_defaults] keys and their types, from `kvmem-server --print_config`."""
        with tempfile.TemporaryDirectory() as tmp:
            out = run_capture([server, "--print_config"], cwd=tmp)
        keys = {}
        section = None
        for line in out.splitlines():
            m = re.match(r"^\[(\w+)\]\s*$", line)
            if m:
                section = m.group(1)
                continue
            m = re.match(r"^#?\s*([a-z_][a-z0-9_]*) = (\S+)", line)
            if section == "stream_defaults" and m:
                try:
                    v = tomllib.loads(f"v = {m.group(2)}")["v"]
                except tomllib.TOMLDecodeError:
                    continue
                keys[m.group(1)] = str if isinstance(v, str) else bool if isinstance(v, bool) else float
        R.check(keys, server, "--print_config shows no [stream_defaults] keys")
        return keys or dict(STREAM_DEFAULT_KEYS)

    def demo_geometry(self):
        """Geometry of `kvmem demo` streams (its flag defaults)."""
        g = {"layers": 4, "kv_heads": 2, "head_dim": 64}
        if self.cli_flags:
            for k in g:
                d = self.cli_flags.get(k, {}).get("default")
                if d and d.isdigit():
                    g[k] = int(d)
        return g


def run_capture(argv, timeout=60, cwd=None):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as e:
        R.error(argv[0], f"cannot run: {e}")
        return ""
    return p.stdout + p.stderr


def flag_name(token):
    return token[2:].split("=", 1)[0].replace("-", "_")


def check_server_args(where, tokens, bins):
    """Flags given to kvmem-server on a command line."""
    settings = {}
    for t in tokens:
        if not t.startswith("--"):
            R.error(where, f"kvmem-server argument {t!r} is not a --flag")
            continue
        name = flag_name(t)
        if bins.server_flags is not None:
            R.check(name in bins.server_flags or name == "print_config", where,
                    f"--{name} is not a kvmem-server flag")
        settings[name] = t.split("=", 1)[1] if "=" in t else True
    return settings


def check_cli_command(where, tokens, bins):
    """A `kvmem SUBCOMMAND --flags` command line; returns its flags."""
    R.check(len(tokens) >= 2, where, f"kvmem command without a subcommand: {tokens}")
    if len(tokens) < 2:
        return {}
    if bins.cli_commands is not None:
        R.check(tokens[1] in bins.cli_commands, where,
                f"`kvmem {tokens[1]}` is not a kvmem subcommand ({sorted(bins.cli_commands)})")
    flags = {}
    for t in tokens[2:]:
        if not t.startswith("--"):
            continue
        name = flag_name(t)
        if bins.cli_flags is not None:
            R.check(name in bins.cli_flags, where, f"--{name} is not a kvmem CLI flag")
        flags[name] = t.split("=", 1)[1] if "=" in t else True
    return flags


def kvmem_commands(text):
    """kvmem CLI invocations inside a shell script: lists of tokens."""
    out = []
    for m in re.finditer(r"(?:^|[\s;&|(])((?:/usr/local/bin/)?kvmem)\s+([a-z]+)((?:\s+--[^\s;&|)]+)*)", text):
        out.append([m.group(1), m.group(2)] + m.group(3).split())
    return out


# -------------------------------------------------------------------- TOML --

def check_toml(where, text, bins):
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        R.error(where, f"TOML does not parse: {e}")
        return {}
    for section in doc:
        R.check(section in ("server", "stream_defaults"), where,
                f"unknown section [{section}] (kvmem-server takes [server] and [stream_defaults])")
        R.check(isinstance(doc[section], dict), where, f"{section} is not a table")
    for key, value in doc.get("server", {}).items():
        if bins.server_own_flags is None:
            continue
        if not R.check(key in bins.server_own_flags, where,
                       f"[server] {key} is not a flag kvmem-server defines in server/ "
                       f"({', '.join(sorted(bins.server_own_flags))})"):
            continue
        want = flag_type(bins.server_own_flags[key]["default"])
        if want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif want is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif want is not None:
            ok = isinstance(value, want)
        else:
            ok = True
        R.check(ok, where, f"[server] {key} = {value!r} is not a {want.__name__ if want else '?'} "
                           f"(the flag's default is {bins.server_own_flags[key]['default']})")
    known = bins.stream_default_keys
    for key, value in doc.get("stream_defaults", {}).items():
        if R.check(key in known, where, f"[stream_defaults] {key} is not a known key "
                                        f"({', '.join(sorted(known))})"):
            want = known[key]
            if want in (int, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok = isinstance(value, want)
            R.check(ok, where, f"[stream_defaults] {key} = {value!r} is not a {'number' if want in (int, float) else want.__name__}")
    if bins.server and bins.print_config:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kvmem.toml")
            with open(path, "w") as f:
                f.write(text)
            try:
                p = subprocess.run([bins.server, f"--config={path}", "--print_config"],
                                   capture_output=True, text=True, timeout=60, cwd=tmp)
                R.check(p.returncode == 0, where,
                        f"kvmem-server --config=... --print_config exited {p.returncode}: "
                        f"{(p.stderr or p.stdout).strip()[-800:]}")
            except (OSError, subprocess.TimeoutExpired) as e:
                R.error(where, f"kvmem-server --print_config: {e}")
    return doc


# ------------------------------------------------------------------- nginx --

def strip_nginx_comments(text):
    return re.sub(r"#[^\n]*", "", text)


def check_nginx(where, text, expected_servers=None, expected_listen=None):
    """Checks the sharding proxy's nginx.conf; returns its upstream servers."""
    body = strip_nginx_comments(text)
    ups = re.findall(r"upstream\s+(\S+)\s*\{(.*?)\}", body, re.S)
    if not R.check(ups, where, "no upstream block"):
        return []
    name, ublock = ups[0]
    R.check(re.search(r"hash\s+\$http_kvmem_stream_id\s+consistent\s*;", ublock), where,
            "upstream must shard with `hash $http_kvmem_stream_id consistent;`")
    servers = re.findall(r"\bserver\s+([^\s;]+)([^;]*);", ublock)
    R.check(servers, where, "upstream has no servers")
    for addr, params in servers:
        R.check(re.search(r"\bmax_fails=0\b", params), where,
                f"upstream server {addr} needs max_fails=0 (a stream must never move)")
        R.check("backup" not in params, where, f"upstream server {addr} must not be a backup")
    R.check(re.search(rf"grpc_pass\s+grpcs?://{re.escape(name)}\s*;", body), where,
            f"no `grpc_pass grpc://{name};`")
    R.check(re.search(r"grpc_next_upstream\s+off\s*;", body), where, "needs `grpc_next_upstream off;`")
    R.check(re.search(r"client_max_body_size\s+0\s*;", body), where, "needs `client_max_body_size 0;`")
    for d in ("grpc_read_timeout", "grpc_send_timeout", "client_body_timeout"):
        R.check(re.search(rf"\b{d}\s+\S+\s*;", body), where, f"sets no {d} (streaming calls are long)")
    listens = re.findall(r"\blisten\s+([^;]+);", body)
    http2 = re.search(r"\bhttp2\s+on\s*;", body) or any("http2" in l for l in listens)
    R.check(http2, where, "the gRPC listener needs HTTP/2 (`listen PORT http2;` or `http2 on;`)")
    if expected_listen is not None:
        R.check(any(re.match(rf"(\S+:)?{expected_listen}\b", l.strip()) for l in listens), where,
                f"does not listen on {expected_listen}")
    addrs = [a for a, _ in servers]
    if expected_servers is not None:
        R.check(sorted(addrs) == sorted(expected_servers), where,
                f"upstream servers {addrs}, expected {expected_servers}")
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx:
        nginx_syntax_check(where, text, addrs, nginx)
    return addrs


def nginx_syntax_check(where, text, addrs, nginx):
    """nginx -t on the config with the upstream hosts replaced by loopback."""
    local = text
    for i, a in enumerate(sorted(set(addrs), key=len, reverse=True)):
        port = a.rsplit(":", 1)[1] if ":" in a else "80"
        local = re.sub(rf"(\bserver\s+){re.escape(a)}\b", rf"\g<1>127.0.0.{i + 1}:{port}", local)
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "logs"))
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(local)
        p = subprocess.run([nginx, "-t", "-q", "-p", tmp, "-e", os.path.join(tmp, "logs", "error.log"),
                            "-c", conf], capture_output=True, text=True, timeout=30)
        out = (p.stdout + p.stderr).strip()
        if p.returncode != 0 and "Permission denied" in out:
            R.note(f"{where}: nginx -t could not run here (permissions): {out[-300:]}")
        else:
            R.check(p.returncode == 0, where, f"nginx -t failed: {out[-800:]}")


# -------------------------------------------------------------- Kubernetes --

def pod_spec(doc):
    if doc["kind"] == "Pod":
        return doc.get("metadata", {}), doc.get("spec", {})
    if doc["kind"] == "Job":
        t = doc["spec"]["template"]
    else:
        t = doc.get("spec", {}).get("template", {})
    return t.get("metadata", {}), t.get("spec", {})


def probe_list(c):
    return [(k, c[k]) for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c]


def port_of(addr):
    m = re.search(r":(\d+)$", str(addr))
    return int(m.group(1)) if m else None


def is_kvmem_server(c):
    cmd = c.get("command") or []
    if cmd:
        return os.path.basename(cmd[0]) == "kvmem-server"
    return re.search(r"(^|/)kvmem(:|@|$)", c.get("image", "")) is not None


def check_k8s_file(path, bins):
    where = os.path.relpath(path)
    with open(path) as f:
        try:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            R.error(where, f"YAML does not parse: {e}")
            return
    R.check(docs, where, "no documents")
    by_kind = {}
    for i, d in enumerate(docs):
        w = f"{where}[{i}]"
        if not R.check(isinstance(d, dict), w, "document is not a mapping"):
            continue
        R.check(isinstance(d.get("apiVersion"), str) and d["apiVersion"], w, "no apiVersion")
        R.check(isinstance(d.get("kind"), str) and d["kind"], w, "no kind")
        R.check(isinstance(d.get("metadata"), dict) and d["metadata"].get("name"), w, "no metadata.name")
        by_kind.setdefault(d.get("kind"), []).append(d)
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
    workloads = [d for k in WORKLOAD_KINDS for d in by_kind.get(k, [])]
    nginx_servers = []

    for cm_name, cm in configmaps.items():
        for key, text in (cm.get("data") or {}).items():
            w = f"{where}: ConfigMap {cm_name} {key}"
            if key.endswith(".toml"):
                check_toml(w, text, bins)
            if key.endswith(".conf") and "upstream" in text:
                nginx_servers = check_nginx(w, text)

    pods = []   # (workload, pod labels)
    for wl in workloads:
        name = wl["metadata"]["name"]
        w = f"{where}: {wl['kind']} {name}"
        meta, spec = pod_spec(wl)
        labels = meta.get("labels") or {}
        pods.append((wl, labels))
        if wl["kind"] != "Pod":
            sel = (wl["spec"].get("selector") or {}).get("matchLabels") or {}
            R.check(sel and all(labels.get(k) == v for k, v in sel.items()), w,
                    f"selector {sel} does not match the pod labels {labels}")
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        claims = {t["metadata"]["name"] for t in (wl["spec"].get("volumeClaimTemplates") or [])
                  } if wl["kind"] == "StatefulSet" else set()
        containers = spec.get("containers") or []
        R.check(containers, w, "no containers")
        for v in volumes.values():
            if "configMap" in v:
                ref = v["configMap"]["name"]
                if R.check(ref in configmaps, w, f"volume {v['name']} uses ConfigMap {ref}, not defined here"):
                    for item in v["configMap"].get("items") or []:
                        R.check(item["key"] in (configmaps[ref].get("data") or {}), w,
                                f"ConfigMap {ref} has no key {item['key']}")
        for c in containers:
            cw = f"{w} container {c.get('name')}"
            R.check(c.get("name") and c.get("image"), cw, "needs name and image")
            for m in c.get("volumeMounts") or []:
                R.check(m["name"] in volumes or m["name"] in claims, cw,
                        f"mounts {m['name']}, which is neither a volume nor a volumeClaimTemplate")
            if is_kvmem_server(c):
                check_k8s_server(cw, wl, meta, spec, c, volumes, claims, configmaps, services, bins)
            for kind, probe in probe_list(c):
                if "exec" in probe:
                    cmd = probe["exec"]["command"]
                    if os.path.basename(cmd[0]) == "kvmem":
                        check_cli_command(f"{cw} {kind}", cmd, bins)

        if wl["kind"] == "StatefulSet":
            svc = wl["spec"].get("serviceName")
            if R.check(svc in services, w, f"serviceName {svc} is not a Service here"):
                R.check(services[svc]["spec"].get("clusterIP") == "None", w,
                        f"governing Service {svc} must be headless (clusterIP: None)")
            # Servers on the shared tier keep nothing locally (--store=rados:).
            shared = any(any(str(a).startswith("--store=rados:") for a in (c.get("args") or []))
                         for c in wl["spec"]["template"]["spec"].get("containers") or [])
            R.check(claims or shared, w, "no volumeClaimTemplates")
            if nginx_servers:
                R.check(len(nginx_servers) == wl["spec"].get("replicas", 1), w,
                        f"{wl['spec'].get('replicas', 1)} replicas but the proxy has "
                        f"{len(nginx_servers)} upstream servers")
                for a in nginx_servers:
                    host = a.rsplit(":", 1)[0]
                    ok = host in services or re.match(rf"^{re.escape(name)}-\d+\.{re.escape(svc or '')}\b", host)
                    R.check(ok, w, f"proxy upstream {a} is neither a Service here nor a pod DNS name")
                    if host in services and port_of(a) is not None:
                        R.check(any(p.get("port") == port_of(a) for p in services[host]["spec"].get("ports", [])),
                                w, f"Service {host} has no port {port_of(a)}")

    for sname, s in services.items():
        w = f"{where}: Service {sname}"
        sel = s["spec"].get("selector") or {}
        if not sel:
            continue
        matched = []
        for wl, labels in pods:
            plain = {k: v for k, v in sel.items() if k != "statefulset.kubernetes.io/pod-name"}
            if all(labels.get(k) == v for k, v in plain.items()):
                pn = sel.get("statefulset.kubernetes.io/pod-name")
                if pn is not None:
                    if wl["kind"] != "StatefulSet":
                        continue
                    m = re.fullmatch(rf"{re.escape(wl['metadata']['name'])}-(\d+)", pn)
                    R.check(m and int(m.group(1)) < wl["spec"].get("replicas", 1), w,
                            f"selects pod {pn}, which StatefulSet {wl['metadata']['name']} does not have")
                matched.append(wl)
        if not R.check(matched, w, f"selector {sel} matches no pod template here"):
            continue
        ports = {}
        for wl in matched:
            for c in pod_spec(wl)[1].get("containers") or []:
                for p in c.get("ports") or []:
                    ports[p.get("name")] = p["containerPort"]
                    ports[p["containerPort"]] = p["containerPort"]
        for p in s["spec"].get("ports") or []:
            tp = p.get("targetPort", p.get("port"))
            R.check(tp in ports, w, f"targetPort {tp} is not a container port of the selected pods")


def check_k8s_server(cw, wl, meta, spec, c, volumes, claims, configmaps, services, bins):
    """A kvmem-server container: its effective settings against the pod."""
    cmd = c.get("command") or []
    tokens = list(cmd[1:]) + list(c.get("args") or [])
    if not cmd:   # the image's ENTRYPOINT (Dockerfile)
        tokens = ["--listen=0.0.0.0:50551", "--data_dir=/data"] + tokens
    settings = {}
    args = check_server_args(cw, tokens, bins)
    cfg = args.get("config")
    if cfg:
        d, base = os.path.dirname(cfg), os.path.basename(cfg)
        text = None
        for m in c.get("volumeMounts") or []:
            v = volumes.get(m["name"], {})
            if "configMap" not in v or v["configMap"]["name"] not in configmaps:
                continue
            data = configmaps[v["configMap"]["name"]].get("data") or {}
            if m.get("subPath") and m["mountPath"] == cfg:
                text = data.get(m["subPath"])
            elif not m.get("subPath") and m["mountPath"].rstrip("/") == d:
                items = v["configMap"].get("items")
                key = next((i["key"] for i in items if i["path"] == base), None) if items else base
                text = data.get(key)
        if R.check(text is not None, cw, f"--config={cfg} is not a file of a mounted ConfigMap"):
            settings.update(tomllib.loads(text).get("server", {}) if _toml_ok(text) else {})
    settings.update(args)
    mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts") or []}

    data_dir = str(settings.get("data_dir", "./kvmem-data"))
    dm = mounts.get(data_dir.rstrip("/"))
    shared = str(settings.get("store", "")).startswith("rados:")  # Nothing local.
    if not shared and R.check(dm, cw, f"--data_dir={data_dir} is not a mounted volume"):
        if wl["kind"] == "StatefulSet":
            R.check(dm["name"] in claims, cw,
                    f"--data_dir={data_dir} is volume {dm['name']}, not a volumeClaimTemplate")

    listen = str(settings.get("listen", "127.0.0.1:50551"))
    sock = str(settings.get("unix_socket", ""))
    R.check(listen or sock, cw, "neither --listen nor --unix_socket: the server would serve nothing")
    cports = {p["containerPort"]: p for p in c.get("ports") or []}
    lport = port_of(listen) if listen else None
    if listen:
        R.check(not listen.startswith("127.") and not listen.startswith("localhost"), cw,
                f"--listen={listen} is loopback: nothing outside the container reaches it")
        R.check(lport in cports, cw, f"listen port {lport} is not a containerPort")
    probes = probe_list(c)
    kinds = {k for k, _ in probes}
    R.check({"readinessProbe", "livenessProbe"} <= kinds, cw, "needs readiness and liveness probes")
    for kind, p in probes:
        if "grpc" in p:
            R.check(listen, cw, f"{kind} is a gRPC probe but the server has no TCP listener")
            R.check(p["grpc"].get("port") == lport, cw,
                    f"{kind} probes port {p['grpc'].get('port')}, the server listens on {lport}")
            if kind == "readinessProbe":
                R.check(p["grpc"].get("service") == "kvmem.v1.KvMemory", cw,
                        "readiness gRPC probe should ask for service kvmem.v1.KvMemory")
        elif "exec" in p:
            cmdline = p["exec"]["command"]
            addr = next((t.split("=", 1)[1] for t in cmdline if t.startswith("--addr=")), "")
            if addr.startswith("unix:"):
                R.check(addr[5:] == sock, cw, f"{kind} connects to {addr}, the socket is {sock or 'off'}")
            elif addr:
                R.check(port_of(addr) == lport, cw, f"{kind} connects to {addr}, the server listens on {listen}")
            else:
                R.error(cw, f"{kind} runs {cmdline} without --addr")
        elif "tcpSocket" in p:
            names = [q.get("name") for q in cports.values() if q["containerPort"] == lport]
            R.check(listen and p["tcpSocket"].get("port") in [lport] + names, cw,
                    f"{kind} TCP port {p['tcpSocket'].get('port')} is not the listen port {lport}")

    if sock:
        sdir = os.path.dirname(sock)
        sm = mounts.get(sdir)
        if R.check(sm, cw, f"no volume mounted at the socket's directory {sdir}"):
            vol = volumes.get(sm["name"], {})
            R.check("emptyDir" in vol, cw, f"the socket volume {sm['name']} should be an emptyDir")
            others = [o for o in spec.get("containers") or [] if o is not c]
            R.check(others, cw, "a socket-only kvmem-server needs a client container in the pod")
            for o in others:
                om = {m["name"]: m["mountPath"].rstrip("/") for m in o.get("volumeMounts") or []}
                R.check(om.get(sm["name"]) == sdir, cw,
                        f"container {o.get('name')} must mount {sm['name']} at {sdir} to reach {sock}")
                env = " ".join(str(e.get("value", "")) for e in o.get("env") or [])
                R.check(sock in env, cw, f"container {o.get('name')} is not told the socket path {sock} (env)")

    metrics = str(settings.get("metrics_listen", ""))
    ann = meta.get("annotations") or {}
    if metrics:
        mport = port_of(metrics)
        R.check(mport in cports, cw, f"metrics port {mport} is not a containerPort")
        R.check(ann.get("prometheus.io/scrape") == "true", cw, "pod lacks prometheus.io/scrape: \"true\"")
        R.check(ann.get("prometheus.io/port") == str(mport), cw,
                f"prometheus.io/port is {ann.get('prometheus.io/port')}, metrics listen on {mport}")
    else:
        R.error(cw, "no --metrics_listen: Prometheus has nothing to scrape")
    res = c.get("resources") or {}
    R.check((res.get("limits") or {}).get("memory") and (res.get("requests") or {}).get("memory"), cw,
            "needs memory requests and limits (warm tier budgets are RAM)")


def _toml_ok(text):
    try:
        tomllib.loads(text)
        return True
    except tomllib.TOMLDecodeError:
        return False


# ---------------------------------------------------------- docker-compose --

def check_compose(path, repo, bins):
    where = os.path.relpath(path)
    base = os.path.dirname(path)
    with open(path) as f:
        try:
            doc = yaml.safe_load(f)
        except yaml.YAMLError as e:
            R.error(where, f"YAML does not parse: {e}")
            return
    services = doc.get("services") or {}
    named_volumes = set((doc.get("volumes") or {}).keys())
    kv = sorted(s for s in services if re.fullmatch(r"kvmem-\d+", s))
    R.check(len(kv) == 3, where, f"expected 3 kvmem services kvmem-0..2, found {kv}")
    for need in ("nginx", "cameras"):
        R.check(need in services, where, f"no {need} service")

    dockerfile = os.path.join(repo, "Dockerfile")
    entry = []
    if R.check(os.path.exists(dockerfile), where, "no Dockerfile at the repository root"):
        with open(dockerfile) as f:
            text = f.read()
        m = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M)
        # Multi-stage, the runtime stage without build tools, non-root, and
        # a health check that runs a real `kvmem` subcommand.
        stages = re.split(r"^FROM\s+", text, flags=re.M)[1:]
        R.check(len(stages) >= 2, "Dockerfile", "expected a build and a runtime stage")
        if stages:
            runtime = stages[-1]
            R.check("COPY --from=" in runtime, "Dockerfile", "runtime stage copies the binaries from the build stage")
            R.check(not re.search(r"bootstrap\.sh|cmake|g\+\+|-dev\b", runtime), "Dockerfile",
                    "runtime stage holds build tools or -dev packages")
            user = re.findall(r"^USER\s+(\S+)", runtime, re.M)
            R.check(user and user[-1] not in ("root", "0"), "Dockerfile", "runtime stage must run as a non-root USER")
            hc = re.search(r"^HEALTHCHECK\b.*?CMD\s+(\[[^\n]*\])[ \t]*$", runtime, re.M | re.S)
            if R.check(hc, "Dockerfile", "no exec-form HEALTHCHECK CMD"):
                cmd = json.loads(hc.group(1))
                R.check(cmd[0].endswith("/kvmem"), "Dockerfile", f"HEALTHCHECK runs {cmd}, not kvmem")
                flags = check_cli_command("Dockerfile HEALTHCHECK", cmd, bins)
                R.check(port_of(flags.get("addr", "")) == 50551 if flags.get("addr") else False,
                        "Dockerfile", "HEALTHCHECK should check --addr=127.0.0.1:50551 (the listen port)")
        if R.check(m, "Dockerfile", "no exec-form ENTRYPOINT"):
            entry = json.loads(m.group(1))
            R.check(entry and entry[0].endswith("kvmem-server"), "Dockerfile", "ENTRYPOINT is not kvmem-server")
    metrics_ports = {}
    data_volumes = set()
    for s in kv:
        svc = services[s]
        w = f"{where}: {s}"
        build = svc.get("build")
        ctx = build.get("context") if isinstance(build, dict) else build
        R.check(ctx and os.path.realpath(os.path.join(base, ctx)) == os.path.realpath(repo), w,
                "should build from the repository root (the root Dockerfile)")
        R.check("entrypoint" not in svc, w, "keeps the image's kvmem-server ENTRYPOINT")
        cmd = svc.get("command") or []
        if isinstance(cmd, str):
            cmd = cmd.split()
        settings = check_server_args(w, entry[1:] + cmd, bins)
        R.check(settings.get("instance_name") == s, w, f"--instance_name should be {s}")
        R.check(port_of(settings.get("metrics_listen", "")), w, "needs --metrics_listen=HOST:PORT")
        R.check(not str(settings.get("listen", "")).startswith("127."), w, "listens on loopback only")
        metrics_ports[s] = port_of(settings.get("metrics_listen", ""))
        data_dir = settings.get("data_dir", "./kvmem-data")
        vols = [v for v in svc.get("volumes") or [] if isinstance(v, str)]
        dv = [v.split(":")[0] for v in vols if v.split(":")[1:2] == [data_dir]]
        if R.check(dv, w, f"no volume at --data_dir={data_dir}"):
            R.check(dv[0] in named_volumes, w, f"data volume {dv[0]} is not a named volume")
            R.check(dv[0] not in data_volumes, w, f"data volume {dv[0]} is shared with another instance")
            data_volumes.add(dv[0])
        hc = (svc.get("healthcheck") or {}).get("test") or []
        for t in kvmem_commands(" ".join(hc) if isinstance(hc, list) else hc):
            check_cli_command(f"{w} healthcheck", t, bins)

    if "nginx" in services:
        n = services["nginx"]
        w = f"{where}: nginx"
        mounts = [v.split(":") for v in n.get("volumes") or [] if isinstance(v, str)]
        conf = [m for m in mounts if m[0].endswith("nginx/kvmem.conf")]
        if R.check(conf, w, "does not mount deploy/nginx/kvmem.conf"):
            R.check(conf[0][1] in ("/etc/nginx/nginx.conf",) or conf[0][1].startswith("/etc/nginx/"), w,
                    f"mounts the config at {conf[0][1]}")
            src = os.path.join(base, conf[0][0])
            if os.path.exists(src):
                with open(src) as f:
                    check_nginx(os.path.relpath(src), f.read(),
                                expected_servers=[f"{s}:50551" for s in kv], expected_listen=50550)
            else:
                R.note(f"{os.path.relpath(src)} does not exist yet (written separately); not checked")
        R.check(any(str(p).split(":")[-1] == "50550" for p in n.get("ports") or []), w, "does not publish 50550")
        deps = n.get("depends_on") or []
        R.check(set(kv) <= set(deps), w, "should depend on every kvmem instance")

    if "cameras" in services:
        cam = services["cameras"]
        w = f"{where}: cameras"
        parts = (cam.get("entrypoint") or []) + (cam.get("command") or [])
        text = " ".join(parts) if isinstance(parts, list) else str(parts)
        cmds = [t for t in kvmem_commands(text) if t[1] == "demo"]
        if R.check(cmds, w, "does not run `kvmem demo`"):
            for t in cmds:
                flags = check_cli_command(w, t, bins)
                R.check(flags.get("addr") == "nginx:50550", w, "kvmem demo should use --addr=nginx:50550")

    for s, svc in services.items():
        for v in svc.get("volumes") or []:
            if isinstance(v, str) and v.startswith("."):
                src = os.path.join(base, v.split(":")[0])
                if not src.endswith("nginx/kvmem.conf"):
                    R.check(os.path.exists(src), f"{where}: {s}", f"bind mount source {v.split(':')[0]} does not exist")

    if "prometheus" in services:
        cfgs = [v.split(":")[0] for v in services["prometheus"].get("volumes") or []
                if isinstance(v, str) and v.split(":")[1:2] == ["/etc/prometheus/prometheus.yml"]]
        if R.check(cfgs, f"{where}: prometheus", "mounts no /etc/prometheus/prometheus.yml"):
            p = os.path.join(base, cfgs[0])
            if os.path.exists(p):
                with open(p) as f:
                    prom = yaml.safe_load(f)
                targets = {t for sc in prom.get("scrape_configs") or []
                           for st in sc.get("static_configs") or [] for t in st.get("targets") or []}
                want = {f"{s}:{metrics_ports[s]}" for s in kv}
                R.check(want <= targets, os.path.relpath(p), f"scrapes {sorted(targets)}, expected {sorted(want)}")
    if "grafana" in services:
        mounts = [v.split(":") for v in services["grafana"].get("volumes") or [] if isinstance(v, str)]
        R.check(any(m[1] == "/etc/grafana/provisioning" for m in mounts), f"{where}: grafana",
                "mounts no provisioning directory")
        R.check(any(m[0].endswith("kvmem-dashboard.json") for m in mounts), f"{where}: grafana",
                "does not mount the kvmem dashboard")


# ----------------------------------------------------------------- Grafana --

# Histograms among the metrics (the rest: names ending in _total are
# counters, others gauges), and the labels of each metric, as
# deploy/grafana/metrics.txt's header states them.
HISTOGRAMS = {"kvmem_recall_latency_seconds", "kvmem_rpc_latency_seconds"}


def metric_labels(name):
    labels = set()
    if name.startswith("kvmem_stream_"):
        labels.add("stream")
    if name in ("kvmem_stream_blocks", "kvmem_stream_bytes", "kvmem_blocks", "kvmem_bytes"):
        labels.add("tier")
    if name == "kvmem_streams":
        labels.add("state")
    if name == "kvmem_metadata_bytes":
        labels.add("kind")
    if name == "kvmem_recall_latency_seconds" or name.startswith("kvmem_rpc_"):
        labels.add("method")
    if name == "kvmem_rpc_errors_total":
        labels.add("code")
    return labels


def load_metrics(path):
    """deploy/grafana/metrics.txt: one metric name a line -> {name: (type, labels)}."""
    metrics = {}
    where = os.path.relpath(path)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            w = f"{where}:{n}"
            if not R.check(re.fullmatch(r"kvmem_[a-z0-9_]+", line), w,
                           f"expected one kvmem_ metric name, got {line!r}"):
                continue
            R.check(line not in metrics, w, f"{line} listed twice")
            typ = "histogram" if line in HISTOGRAMS else "counter" if line.endswith("_total") else "gauge"
            metrics[line] = (typ, metric_labels(line))
    R.check(metrics, where, "no metrics")
    for h in HISTOGRAMS:
        R.check(h in metrics, where, f"no {h}")
    return metrics


def resolve_metric(name, metrics):
    """(base name, is_bucket) or None."""
    if name in metrics:
        return name, False
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf) and metrics.get(name[: -len(suf)], ("",))[0] == "histogram":
            return name[: -len(suf)], suf == "_bucket"
    return None


def check_promql(w, expr, metrics, legend=None):
    used = set()
    labels = set(PROMETHEUS_TARGET_LABELS)
    names = re.findall(r"\b(kvmem_[A-Za-z0-9_]+)\b", expr)
    R.check(names, w, f"query uses no kvmem metric: {expr}")
    stack = []
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or "([{"[")]}".index(ch)] != stack.pop():
                stack.append("!")
                break
    R.check(not stack, w, f"unbalanced brackets in {expr}")
    bucket = False
    for name in names:
        r = resolve_metric(name, metrics)
        if not R.check(r, w, f"{name} is not in metrics.txt"):
            continue
        base, is_bucket = r
        bucket |= is_bucket
        used.add(base)
        typ, mlabels = metrics[base]
        R.check(not (typ == "histogram" and name == base), w, f"{name} is a histogram: use {name}_bucket/_sum/_count")
        labels |= mlabels
    if bucket:
        labels.add("le")
    for name, inner in re.findall(r"\b(kvmem_[A-Za-z0-9_]+)\s*\{([^}]*)\}", expr):
        r = resolve_metric(name, metrics)
        if not r:
            continue
        allowed = metrics[r[0]][1] | PROMETHEUS_TARGET_LABELS | ({"le"} if r[1] else set())
        for lab in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", inner):
            R.check(lab in allowed, w, f"{name} has no label {lab}")
    grouped = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for lab in [g.strip() for g in group.split(",") if g.strip()]:
            grouped.add(lab)
            R.check(lab in labels, w, f"groups by {lab}, which no metric of the query has")
    if "histogram_quantile" in expr:
        R.check(bucket and "le" in grouped, w, "histogram_quantile needs rate(..._bucket) summed by le")
    if legend:
        for lab in re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend):
            R.check(lab in grouped or (not grouped and lab in labels), w,
                    f"legend uses {{{{{lab}}}}}, which the query does not keep")
    return used


def walk_panels(panels):
    for p in panels or []:
        yield p
        yield from walk_panels(p.get("panels"))


def check_dashboard(path, metrics):
    where = os.path.relpath(path)
    with open(path) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            R.error(where, f"JSON does not parse: {e}")
            return
    R.check(d.get("title") and d.get("uid"), where, "needs title and uid")
    R.check(isinstance(d.get("schemaVersion"), int) and d["schemaVersion"] >= 36, where,
            "schemaVersion should be >= 36")
    variables = {v["name"]: v for v in (d.get("templating") or {}).get("list") or []}
    ds_vars = {n for n, v in variables.items() if v.get("type") == "datasource"}
    R.check(ds_vars or "__inputs" in d, where, "no datasource variable (or ${DS_...} input)")
    builtin = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s", "__range_ms"}
    inputs = {i["name"] for i in d.get("__inputs") or []}

    def check_vars(w, text):
        for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text):
            R.check(name in variables or name in builtin or name in inputs, w, f"${name} is not a variable")

    used = set()
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        w = f"{where}: variable {name}"
        check_vars(w, json.dumps(v.get("datasource")))
        m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", q or "")
        if R.check(m, w, f"expected label_values(METRIC, LABEL), got {q!r}"):
            used |= check_promql(w, m.group(1), metrics)
            r = resolve_metric(re.findall(r"kvmem_[A-Za-z0-9_]+", m.group(1))[0], metrics)
            if r:
                R.check(m.group(2) in metrics[r[0]][1] | PROMETHEUS_TARGET_LABELS, w,
                        f"{r[0]} has no label {m.group(2)}")
            check_vars(w, m.group(1))
    R.check("stream" in variables, where, "no stream variable")
    if "stream" in variables:
        q = variables["stream"].get("query")
        q = q.get("query") if isinstance(q, dict) else q
        R.check("kvmem_stream_frames_total" in (q or "") and q.rstrip().endswith("stream)"), where,
                "the stream variable should be label_values(kvmem_stream_frames_total, stream)")

    ids = set()
    for p in walk_panels(d.get("panels")):
        w = f"{where}: panel {p.get('id')} {p.get('title')!r}"
        R.check(p.get("id") not in ids, w, "duplicate panel id")
        ids.add(p.get("id"))
        gp = p.get("gridPos") or {}
        R.check(all(k in gp for k in ("h", "w", "x", "y")) and gp.get("x", 0) + gp.get("w", 0) <= 24, w,
                f"bad gridPos {gp}")
        if p.get("type") == "row":
            continue
        R.check(p.get("targets"), w, "no queries")
        check_vars(w, json.dumps(p.get("datasource")))
        refs = set()
        for t in p.get("targets") or []:
            R.check(t.get("refId") not in refs, w, f"duplicate refId {t.get('refId')}")
            refs.add(t.get("refId"))
            expr = t.get("expr", "")
            check_vars(w, expr + json.dumps(t.get("datasource")))
            used |= check_promql(w, expr, metrics, t.get("legendFormat"))
    required = {
        "kvmem_recall_latency_seconds": "recall latency",
        "kvmem_recalls_total": "recalls/s",
        "kvmem_frames_total": "frames/s",
        "kvmem_blocks": "blocks by tier",
        "kvmem_bytes": "bytes by tier",
        "kvmem_stage_hits_total|kvmem_stream_stage_hits_total": "stage hit ratio",
        "kvmem_stage_misses_total|kvmem_stream_stage_misses_total": "stage hit ratio",
        "kvmem_demotions_total": "demotions",
        "kvmem_promotions_total": "promotions",
        "kvmem_evictions_total": "evictions",
        "kvmem_index_rebuilds_total": "index rebuilds",
        "kvmem_accel_modelled_seconds_total": "modelled accelerator time",
        "kvmem_rpc_errors_total": "RPC errors by code",
    }
    for m, what in required.items():
        R.check(used & set(m.split("|")), where, f"no panel shows {what} ({m})")
    unused = sorted(set(metrics) - used)
    if unused:
        R.note(f"{where}: metrics.txt entries no panel uses: {', '.join(unused)}")


def check_grafana_provisioning(repo):
    for p in sorted(glob.glob(os.path.join(repo, "deploy/grafana/provisioning/**/*.y*ml"), recursive=True)):
        w = os.path.relpath(p)
        with open(p) as f:
            try:
                doc = yaml.safe_load(f)
            except yaml.YAMLError as e:
                R.error(w, f"YAML does not parse: {e}")
                continue
        R.check(isinstance(doc, dict) and doc.get("apiVersion") == 1, w, "Grafana provisioning needs apiVersion: 1")
        R.check(doc.get("datasources") or doc.get("providers"), w, "neither datasources nor providers")


# --------------------------------------------------------------------- ghz --

def load_proto_modules(repo, protoc, tmp):
    os.makedirs(tmp, exist_ok=True)
    subprocess.run([protoc, "-I", os.path.join(repo, "proto"), f"--python_out={tmp}"] +
                   sorted(glob.glob(os.path.join(repo, "proto/kvmem/v1/*.proto"))), check=True)
    sys.path.insert(0, tmp)
    from kvmem.v1 import service_pb2  # noqa: E402
    from google.protobuf import json_format, symbol_database  # noqa: E402
    return service_pb2, json_format, symbol_database.Default()


class CallData:
    """ghz's call template data for one call."""

    def __init__(self, n):
        now = time.time()
        self.values = {
            "RequestNumber": str(n), "UUID": str(uuid.uuid4()), "WorkerID": "g0c0",
            "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "TimestampUnix": str(int(now)), "TimestampUnixMilli": str(int(now * 1e3)),
            "TimestampUnixNano": str(int(now * 1e9)), "MethodName": "", "ServiceName": "KvMemory",
            "FullyQualifiedName": "", "InputName": "", "OutputName": "",
        }

    def render(self, obj):
        text = GHZ_TEMPLATE.sub(lambda m: self.values[m.group(1)], json.dumps(obj))
        return json.loads(text)


def templated(obj):
    return bool(GHZ_TEMPLATE.search(json.dumps(obj)))


def geometry_of(config):
    g = dict(config.get("geometry") or {})
    for k in ("layers", "kv_heads", "head_dim", "max_tokens_per_frame"):
        g[k] = int(g.get(k, 0))
    return g


def frame_bytes(g, tokens):
    return g["layers"] * 2 * g["kv_heads"] * tokens * g["head_dim"] * DTYPE_BYTES.get(g.get("dtype"), 0)


def summary_dim(config):
    g = geometry_of(config)
    layers = (config.get("index_policy") or {}).get("indexed_layers") or range(g["layers"])
    return len(list(layers)) * g["kv_heads"] * g["head_dim"]


class Frames:
    """Checks a sequence of frames appended to one stream."""

    def __init__(self, w, geometry):
        self.w, self.g = w, geometry
        self.next_index = 0
        self.end = None
        self.open = None   # (header, bytes received)

    def header(self, f):
        w = self.w
        self.finish()
        idx, pos, tokens = int(f.get("frame_index", 0)), int(f.get("first_token_position", 0)), int(f.get("token_count", 0))
        R.check(idx == self.next_index, w, f"frame_index {idx}, the server expects {self.next_index}")
        R.check(self.end is None or pos >= self.end, w,
                f"frame {idx} starts at token {pos}, before the previous frame's end {self.end}")
        R.check(1 <= tokens <= self.g["max_tokens_per_frame"], w,
                f"token_count {tokens} outside 1..{self.g['max_tokens_per_frame']}")
        want = frame_bytes(self.g, tokens)
        R.check(int(f.get("payload_bytes", 0)) == want, w,
                f"frame {idx}: payload_bytes {f.get('payload_bytes')}, the geometry makes {want}")
        self.next_index, self.end = idx + 1, pos + tokens
        self.open = (int(f.get("payload_bytes", 0)), len(base64.b64decode(f.get("payload", ""))), idx)

    def chunk(self, c):
        if not R.check(self.open, self.w, "PayloadChunk without an open frame"):
            return
        total, got, idx = self.open
        R.check(int(c.get("frame_index", 0)) == idx, self.w, "chunk frame_index does not match its frame")
        R.check(int(c.get("offset", 0)) == got, self.w, f"chunk offset {c.get('offset')}, expected {got}")
        self.open = (total, got + len(base64.b64decode(c.get("data", ""))), idx)

    def finish(self):
        if self.open:
            total, got, idx = self.open
            R.check(got == total, self.w, f"frame {idx}: {got} payload bytes sent of {total}")
            self.open = None


def check_ghz(repo, bins, protos):
    service_pb2, json_format, symdb = protos
    svc = service_pb2.DESCRIPTOR.services_by_name["KvMemory"]
    files = sorted(glob.glob(os.path.join(repo, "deploy/ghz/*.json")))
    R.check(files, "deploy/ghz", "no ghz configs")
    configs = {}
    for path in files:
        w = os.path.relpath(path)
        with open(path) as f:
            try:
                configs[path] = json.load(f)
            except json.JSONDecodeError as e:
                R.error(w, f"JSON does not parse: {e}")
    # Streams the configs create with OpenStream.
    opened = {}
    for path, cfg in configs.items():
        if str(cfg.get("call", "")).endswith(".OpenStream") and isinstance(cfg.get("data"), dict):
            opened[cfg["data"].get("stream_id")] = cfg["data"].get("config") or {}
    demo = bins.demo_geometry()
    demo_config = {"geometry": dict(demo, dtype="DTYPE_FP16", max_tokens_per_frame=1 << 16)}
    calls = set()
    for path, cfg in configs.items():
        w = os.path.relpath(path)
        for k in cfg:
            R.check(k in GHZ_KEYS, w, f"{k!r} is not a ghz config key")
        for k in ("call", "host", "total", "concurrency", "data", "metadata"):
            R.check(k in cfg, w, f"no {k!r}")
        R.check(cfg.get("insecure") is True, w, "kvmem-server serves plaintext here: set \"insecure\": true")
        R.check("proto" not in cfg and "protoset" not in cfg, w, "no proto/protoset: ghz uses server reflection")
        total, conc = cfg.get("total", 0), cfg.get("concurrency", 1)
        R.check(isinstance(total, int) and total >= 1 and isinstance(conc, int) and 1 <= conc <= total, w,
                "needs 1 <= concurrency <= total")
        R.check(cfg.get("connections", 1) <= conc, w, "more connections than concurrency")
        call = str(cfg.get("call", ""))
        m = re.fullmatch(r"kvmem\.v1\.KvMemory\.(\w+)", call)
        if not R.check(m and m.group(1) in svc.methods_by_name, w, f"call {call!r} is not a kvmem.v1.KvMemory method"):
            continue
        method = svc.methods_by_name[m.group(1)]
        calls.add(method.name)
        cls = symdb.GetSymbol(method.input_type.full_name)
        data = cfg.get("data")
        if method.client_streaming:
            R.check(isinstance(data, list) and data, w, "a streaming call's data is a non-empty array of messages")
        else:
            R.check(isinstance(data, dict), w, "a unary call's data is one message (an object)")
        msgs_per_call = []
        seen_ids = set()
        for n in range(3):
            cd = CallData(n)
            rendered = cd.render(data)
            md = cd.render(cfg.get("metadata") or {})
            items = rendered if isinstance(rendered, list) else [rendered]
            parsed = []
            for j, item in enumerate(items):
                try:
                    msg = json_format.ParseDict(item, cls())
                    parsed.append(json_format.MessageToDict(msg, preserving_proto_field_name=True,
                                                            use_integers_for_enums=False))
                except json_format.ParseError as e:
                    R.error(w, f"call {n} message {j} does not parse as {cls.DESCRIPTOR.full_name}: {e}")
                    parsed = None
                    break
            if parsed is None:
                break
            sid = stream_of(method.name, parsed)
            R.check(sid and STREAM_ID_RE.match(sid), w, f"stream id {sid!r} is not 1..128 of [A-Za-z0-9._:-]")
            R.check(md.get("kvmem-stream-id") == sid, w,
                    f"metadata kvmem-stream-id {md.get('kvmem-stream-id')!r} differs from the call's stream {sid!r}")
            seen_ids.add(sid)
            msgs_per_call.append((sid, parsed))
        if len(msgs_per_call) != 3:
            continue
        name = method.name
        if name == "Recall":
            for sid, (req,) in [(s, p[:1]) for s, p in msgs_per_call]:
                conf = opened.get(sid) or (demo_config if re.fullmatch(r"demo-cam-\d+", sid or "") else None)
                if R.check(conf, w, f"Recall on {sid}: no config here creates it"):
                    R.check(len(req.get("query", [])) == summary_dim(conf), w,
                            f"query has {len(req.get('query', []))} floats, {sid}'s summary_dim is {summary_dim(conf)}")
        elif name == "AppendFrames":
            sid = msgs_per_call[0][0]
            R.check(len(seen_ids) == 1, w, "every call appends to the one stream the OpenStream config creates")
            conf = opened.get(sid)
            if R.check(conf, w, f"no OpenStream config in deploy/ghz creates {sid}"):
                fr = Frames(w, geometry_of(conf))
                for _, msgs in msgs_per_call:   # calls 0, 1, 2 in order
                    R.check(msgs[0].get("stream_id") == sid, w, "the first message of a call needs stream_id")
                    for msg in msgs:
                        if "frame" in msg:
                            fr.header(msg["frame"])
                        elif "chunk" in msg:
                            fr.chunk(msg["chunk"])
                    fr.finish()
                if templated([x.get("frame", {}).get("frame_index") for x in data if isinstance(x, dict)]):
                    R.check(conc == 1 and cfg.get("connections", 1) == 1 and not cfg.get("async"), w,
                            "frame_index follows {{.RequestNumber}}: calls must run one at a time "
                            "(concurrency 1), or frames arrive out of order")
        elif name == "Session":
            R.check(len(seen_ids) == 3 or conc == 1, w,
                    "concurrent sessions appending frames 0.. need a fresh stream per call ({{.UUID}} in stream_id)")
            for sid, msgs in msgs_per_call:
                R.check("open" in msgs[0], w, "a session starts with an open message")
                conf = (msgs[0].get("open") or {}).get("config") or opened.get(sid)
                if not R.check(conf and conf.get("geometry"), w, f"session on {sid} without a config"):
                    break
                fr = Frames(w, geometry_of(conf))
                seqs = [int(x.get("seq", 0)) for x in msgs]
                R.check(len(set(seqs)) == len(seqs), w, "seq numbers repeat")
                recalls = 0
                for msg in msgs[1:]:
                    if "frame" in msg:
                        fr.header(msg["frame"])
                    elif "chunk" in msg:
                        fr.chunk(msg["chunk"])
                    elif "recall" in msg:
                        fr.finish()
                        recalls += 1
                        q = msg["recall"].get("query", [])
                        R.check(len(q) == summary_dim(conf), w,
                                f"recall query has {len(q)} floats, the stream's summary_dim is {summary_dim(conf)}")
                        rs = msg["recall"].get("stream_id")
                        R.check(not rs or rs == sid, w, "recall names another stream")
                    elif "open" in msg:
                        R.error(w, "a second open in one session")
                fr.finish()
                R.check(recalls, w, "the session sends no recall")
        elif name == "OpenStream":
            conf = msgs_per_call[0][1][0].get("config") or {}
            g = geometry_of(conf)
            R.check(all(g[k] > 0 for k in ("layers", "kv_heads", "head_dim", "max_tokens_per_frame"))
                    and g.get("dtype") in DTYPE_BYTES, w, f"incomplete geometry {g}")
    for need in ("Recall", "AppendFrames", "Session"):
        R.check(need in calls, "deploy/ghz", f"no config calls {need}")
    return configs


def stream_of(method, msgs):
    if method == "Session":
        return ((msgs[0].get("open") or {}).get("stream_id")) if msgs else None
    return msgs[0].get("stream_id") if msgs else None


# -------------------------------------------------------------------- live --

class Live:
    """Runs ghz configs' calls against a server with grpcio."""

    def __init__(self, addr, protos):
        import grpc
        self.grpc = grpc
        self.service_pb2, self.json_format, self.symdb = protos
        self.channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20),
                                                            ("grpc.max_receive_message_length", 64 << 20)])
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.svc = self.service_pb2.DESCRIPTOR.services_by_name["KvMemory"]

    def call(self, method_name, data, metadata, timeout=30):
        m = self.svc.methods_by_name[method_name]
        req_cls = self.symdb.GetSymbol(m.input_type.full_name)
        resp_cls = self.symdb.GetSymbol(m.output_type.full_name)
        path = f"/kvmem.v1.KvMemory/{method_name}"
        items = data if isinstance(data, list) else [data]
        reqs = [self.json_format.ParseDict(x, req_cls()) for x in items]
        md = list((metadata or {}).items())
        kw = dict(request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString)
        if m.client_streaming and m.server_streaming:
            return list(self.channel.stream_stream(path, **kw)(iter(reqs), metadata=md, timeout=timeout))
        if m.client_streaming:
            return self.channel.stream_unary(path, **kw)(iter(reqs), metadata=md, timeout=timeout)
        if m.server_streaming:
            return list(self.channel.unary_stream(path, **kw)(reqs[0], metadata=md, timeout=timeout))
        return self.channel.unary_unary(path, **kw)(reqs[0], metadata=md, timeout=timeout)

    def run_config(self, cfg, n):
        cd = CallData(n)
        method = cfg["call"].rsplit(".", 1)[1]
        return self.call(method, cd.render(cfg["data"]), cd.render(cfg.get("metadata") or {})), cd


def live_checks(addr, configs, protos, calls):
    try:
        live = Live(addr, protos)
    except Exception as e:  # noqa: BLE001
        R.error("live", f"cannot reach {addr}: {e}")
        return
    grpc = live.grpc
    by_name = {os.path.basename(p): c for p, c in configs.items()}

    def delete(sid):
        try:
            live.call("DeleteStream", {"stream_id": sid}, {"kvmem-stream-id": sid})
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise

    try:
        if "recall.json" in by_name:
            cfg = by_name["recall.json"]
            for n in range(calls):
                r, _ = live.run_config(cfg, n)
                budget = cfg["data"].get("budget", {}).get("max_tokens") or r.budget_tokens
                R.check(r.blocks and r.total_tokens <= budget, "live recall.json",
                        f"call {n}: {len(r.blocks)} blocks, {r.total_tokens} tokens (budget {budget})")
            print(f"live recall.json: {calls} calls; last: {len(r.blocks)} blocks, {r.total_tokens} tokens, "
                  f"{r.candidates} candidates")
        if "append.json" in by_name:
            sid = by_name["append.json"]["data"][0]["stream_id"]
            if "append-delete.json" in by_name:
                try:
                    live.run_config(by_name["append-delete.json"], 0)
                except grpc.RpcError as e:
                    R.check(e.code() == grpc.StatusCode.NOT_FOUND, "live append-delete.json", str(e))
            else:
                delete(sid)
            if R.check("append-open.json" in by_name, "live", "no append-open.json"):
                r, _ = live.run_config(by_name["append-open.json"], 0)
                R.check(r.created, "live append-open.json", "did not create the stream")
            for n in range(calls):
                r, _ = live.run_config(by_name["append.json"], n)
                R.check(r.last_durable_frame == n and r.frames_written == 1, "live append.json",
                        f"call {n}: last_durable_frame {r.last_durable_frame}, frames_written {r.frames_written}")
            print(f"live append.json: {calls} calls after append-open.json; last: last_durable_frame "
                  f"{r.last_durable_frame}, {r.bytes_written} bytes, {r.sealed_blocks} blocks sealed")
            if "append-delete.json" in by_name:
                live.run_config(by_name["append-delete.json"], 0)
            else:
                delete(sid)
        if "session.json" in by_name:
            cfg = by_name["session.json"]
            for n in range(calls):
                out, cd = live.run_config(cfg, n)
                sid = cd.render(cfg["metadata"])["kvmem-stream-id"]
                kinds = [r.WhichOneof("item") for r in out]
                frames = sum(1 for x in cfg["data"] if "frame" in x)
                R.check(kinds.count("opened") == 1 and kinds.count("ack") == frames and kinds.count("recall") >= 1
                        and "error" not in kinds, "live session.json", f"call {n}: responses {kinds}")
                recalls = [r.recall for r in out if r.WhichOneof("item") == "recall"]
                R.check(recalls and recalls[-1].blocks, "live session.json",
                        f"call {n}: the recall returned no block")
                R.check([r.seq for r in out] == sorted(r.seq for r in out), "live session.json",
                        "responses out of request order")
                delete(sid)
            print(f"live session.json: {calls} calls, each a fresh stream; last: responses {kinds}, "
                  f"recall {len(recalls[-1].blocks) if recalls else 0} blocks")
    except grpc.RpcError as e:
        R.error("live", f"{e.code().name}: {e.details()}")


def check_served_metrics(url, metrics):
    """The server's /metrics against metrics.txt and the type and label rules."""
    import urllib.request
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    labels = {}
    for m in re.finditer(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})? ", text, re.M):
        name = m.group(1)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if types.get(base) != "histogram":
            base = name
        labels.setdefault(base, set()).update(k for k in re.findall(r'(\w+)="', m.group(2) or "") if k != "le")
    w = f"live {url}"
    for name, (typ, labs) in metrics.items():
        if R.check(name in types, w, f"{name} (metrics.txt) is not served"):
            R.check(types[name] == typ, w, f"{name} is a {types[name]}, metrics.txt's rules say {typ}")
            if name in labels:
                R.check(labels[name] == labs, w, f"{name} has labels {sorted(labels[name])}, "
                                                 f"metrics.txt's rules say {sorted(labs)}")
    extra = sorted(n for n in types if n.startswith("kvmem_") and n not in metrics)
    if extra:
        R.note(f"served but not in metrics.txt: {', '.join(extra)}")
    print(f"live /metrics: {len([n for n in types if n.startswith('kvmem_')])} kvmem_ metrics served, "
          f"{len(metrics)} in metrics.txt checked for type and labels")


def start_server(server, cli, tmp, metrics):
    data = os.path.join(tmp, "data")
    port_file = os.path.join(tmp, "port")
    log = open(os.path.join(tmp, "server.log"), "w")
    argv = [server, "--listen=127.0.0.1:0", f"--port_file={port_file}", f"--data_dir={data}"]
    if metrics:
        argv += ["--metrics_listen=127.0.0.1:0", f"--metrics_port_file={os.path.join(tmp, 'mport')}"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(port_file) and open(port_file).read().strip():
            break
        time.sleep(0.1)
    if not os.path.exists(port_file):
        proc.kill()
        raise RuntimeError("kvmem-server did not start: " + open(os.path.join(tmp, "server.log")).read()[-800:])
    addr = f"127.0.0.1:{open(port_file).read().strip()}"
    p = subprocess.run([cli, "demo", f"--addr={addr}", "--cameras=1", "--frames=60"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        proc.kill()
        raise RuntimeError(f"kvmem demo failed: {(p.stdout + p.stderr)[-800:]}")
    return proc, addr


# -------------------------------------------------------------------- main --

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..")))
    ap.add_argument("--server-binary", help="kvmem-server (flag names, --print_config, --live)")
    ap.add_argument("--cli-binary", help="the kvmem CLI (subcommands and flags, demo geometry, --live)")
    ap.add_argument("--protoc", default=shutil.which("protoc") or "/usr/bin/protoc")
    ap.add_argument("--live", action="store_true", help="also run the ghz configs' calls against a server")
    ap.add_argument("--live-addr", help="with --live: use this server (demo-cam-0 must exist) instead of starting one")
    ap.add_argument("--live-calls", type=int, default=3, help="with --live: calls per config")
    args = ap.parse_args()
    repo = os.path.realpath(args.repo)
    os.chdir(repo)

    if args.live:
        try:
            importlib.import_module("grpc")
        except ImportError:
            print("SKIP: python3-grpcio is not installed")
            return SKIP
        if not args.live_addr and not (args.server_binary and args.cli_binary):
            print("--live needs --live-addr, or --server-binary and --cli-binary")
            return 2

    bins = Binaries(args.server_binary, args.cli_binary)
    metrics = load_metrics(os.path.join(repo, "deploy/grafana/metrics.txt"))

    for p in sorted(glob.glob(os.path.join(repo, "deploy/grafana/*.json"))):
        check_dashboard(p, metrics)
    check_grafana_provisioning(repo)
    k8s = sorted(glob.glob(os.path.join(repo, "deploy/k8s/*.yaml")) + glob.glob(os.path.join(repo, "deploy/k8s/*.yml")))
    R.check(k8s, "deploy/k8s", "no manifests")
    for p in k8s:
        check_k8s_file(p, bins)
    names = {os.path.basename(p) for p in k8s}
    R.check({"sidecar.yaml", "statefulset.yaml"} <= names, "deploy/k8s", "expected sidecar.yaml and statefulset.yaml")
    compose = os.path.join(repo, "deploy/docker-compose.yml")
    if R.check(os.path.exists(compose), "deploy", "no docker-compose.yml"):
        check_compose(compose, repo, bins)
    for p in sorted(glob.glob(os.path.join(repo, "deploy/prometheus/*.yml"))):
        with open(p) as f:
            try:
                yaml.safe_load(f)
            except yaml.YAMLError as e:
                R.error(os.path.relpath(p), f"YAML does not parse: {e}")

    with tempfile.TemporaryDirectory() as tmp:
        protos = load_proto_modules(repo, args.protoc, os.path.join(tmp, "py"))
        configs = check_ghz(repo, bins, protos)
        if args.live and not R.errors:
            proc = None
            try:
                addr = args.live_addr
                metrics_port = None
                if not addr:
                    with_metrics = "metrics_listen" in (bins.server_flags or {})
                    proc, addr = start_server(bins.server, bins.cli, tmp, with_metrics)
                    mport = os.path.join(tmp, "mport")
                    if with_metrics and os.path.exists(mport):
                        metrics_port = open(mport).read().strip()
                live_checks(addr, configs, protos, args.live_calls)
                if metrics_port:
                    check_served_metrics(f"http://127.0.0.1:{metrics_port}/metrics", metrics)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                R.error("live", str(e))
            finally:
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()

    for n in R.notes:
        print(f"note: {n}")
    for e in R.errors:
        print(f"FAIL: {e}")
    print(f"{R.checks} checks, {len(R.errors)} failed")
    return 1 if R.errors else 0


if __name__ == "__main__":
    sys.exit(main())
