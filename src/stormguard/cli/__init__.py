"""The ``stormguard`` command: ``serve``, ``check``, ``rules validate``, ``queue``,
``simulate``.

Exit codes: 0 success (``check``: allowed), 1 denied or invalid rules, 2 bad usage
(flags, unreadable files, bad configuration), 3 the store failed, 4 ``serve`` could not
start serving (the port is in use, the address is not available).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any, NoReturn

from stormguard._core.errors import ConfigError, StorageError

__all__ = ["main"]

EXIT_DENIED = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_LISTEN = 4
SAMPLE_RULES = "<packaged sample rules>"
log = logging.getLogger("stormguard.service")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subcommands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, but an unknown flag is reported with the usage of the
        subcommand it was given to (``serve --bogus``), not the top-level one."""
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            sub: argparse.ArgumentParser = self
            for name in ("command", "rules_command", "queue_command"):
                choices = getattr(sub, "subcommands", {})
                if getattr(ns, name, None) in choices:
                    sub = choices[getattr(ns, name)]
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a port number: {text!r} (from --port or STORMGUARD_PORT)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {port}")
    return port


def _version() -> str:
    """The installed distribution's version (the package root is not imported for it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stormguard")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="stormguard", description="stormguard: rate limiting as a service.")
    p.add_argument("--version", action="version", version=f"stormguard {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    serve = sub.add_parser(
        "serve", help="run the rate-limit service (HTTP)",
        description="Run the rate-limit service. Every option can also be set by an "
        "environment variable; the control plane is enabled by STORMGUARD_ADMIN_TOKEN.")
    serve.add_argument("--store", default=_env("STORMGUARD_STORE", "memory://"),
                       help="store URL: memory:// (default), redis://host:6379/0, "
                       "redis+cluster://h1:p1,h2:p2 [env STORMGUARD_STORE]")
    serve.add_argument("--rules", default=_env("STORMGUARD_RULES"),
                       help="rules file (YAML); control-plane edits are written back to it, "
                       "comments and key order kept. Default with the memory store: the "
                       "packaged sample rules; with Redis: the rules in Redis "
                       "[env STORMGUARD_RULES]")
    serve.add_argument("--sample-rules", action="store_true",
                       default=_env("STORMGUARD_SAMPLE_RULES", "") not in ("", "0"),
                       help="serve the packaged sample rules; with a Redis store, also "
                       "write them into a Redis that holds no rules (never done without "
                       "this flag) [env STORMGUARD_SAMPLE_RULES=1]")
    serve.add_argument("--host", default=_env("STORMGUARD_HOST", "127.0.0.1"),
                       help="address to listen on (default 127.0.0.1) [env STORMGUARD_HOST]")
    serve.add_argument("--port", type=_port, default=_env("STORMGUARD_PORT", "8080"),
                       help="port (default 8080) [env STORMGUARD_PORT]")
    serve.add_argument("--on-error", choices=("allow", "deny", "local"),
                       default=_env("STORMGUARD_ON_ERROR", "allow"),
                       help="what a check gets when the store fails (default allow) "
                       "[env STORMGUARD_ON_ERROR]")
    serve.add_argument("--http", choices=("h11", "httptools"),
                       default=_env("STORMGUARD_HTTP", "h11"),
                       help="HTTP parser: h11 (default) bounds the request line + headers "
                       "to 16 KiB; httptools is about 2-3x faster but reads headers of any "
                       "size: only behind a proxy that bounds them [env STORMGUARD_HTTP]")
    serve.add_argument("--grpc-port", type=_port, default=_env("STORMGUARD_GRPC_PORT"),
                       help="also serve Envoy's rate-limit service (gRPC, "
                       "envoy.service.ratelimit.v3) on this port, same host, store and rules "
                       "[env STORMGUARD_GRPC_PORT]")
    serve.add_argument("--envoy-config", default=_env("STORMGUARD_ENVOY_CONFIG"),
                       metavar="DIR",
                       help="envoyproxy/ratelimit configuration: a directory of YAML files "
                       "(or one file) in its format, for the gRPC service "
                       "[env STORMGUARD_ENVOY_CONFIG]")
    serve.add_argument("--envoy-headers", action="store_true",
                       default=_env("STORMGUARD_ENVOY_HEADERS", "") not in ("", "0"),
                       help="add the RateLimit headers (and Retry-After) to gRPC answers' "
                       "response_headers_to_add, as envoyproxy/ratelimit's "
                       "LIMIT_RESPONSE_HEADERS_ENABLED [env STORMGUARD_ENVOY_HEADERS=1]")
    serve.add_argument("--trusted-proxies", default=_env("STORMGUARD_TRUSTED_PROXIES", ""),
                       metavar="ADDRS",
                       help="comma-separated addresses or networks (127.0.0.1,10.0.0.0/8) "
                       "whose X-Original-Method / X-Original-URI / X-Real-IP headers "
                       "/v1/auth believes (nginx auth_request) [env STORMGUARD_TRUSTED_PROXIES]")
    serve.add_argument("--log-level", default=_env("STORMGUARD_LOG_LEVEL", "info"),
                       choices=("critical", "error", "warning", "info", "debug"),
                       help="[env STORMGUARD_LOG_LEVEL]")
    serve.add_argument("--log-format", choices=("text", "json"),
                       default=_env("STORMGUARD_LOG_FORMAT", "text"),
                       help="text (default) or json: one JSON object per line, for the "
                       "service's and uvicorn's lines alike [env STORMGUARD_LOG_FORMAT]")

    check = sub.add_parser("check", help="one check of KEY against RULE",
                           description="Check (and consume) KEY against RULE: a rule name "
                           "from the rules file or a rule like '100/minute'. Exit 0 when "
                           "allowed, 1 when denied, 3 when the store fails.")
    check.add_argument("key")
    check.add_argument("rule")
    check.add_argument("--store", default=_env("STORMGUARD_STORE", "memory://"),
                       help="store URL [env STORMGUARD_STORE]")
    check.add_argument("--rules", default=_env("STORMGUARD_RULES"),
                       help="rules file for rule names [env STORMGUARD_RULES]")
    check.add_argument("--cost", type=int, default=1)
    check.add_argument("--json", action="store_true", help="print the decision as JSON")

    rules = sub.add_parser("rules", help="work with rules files")
    rsub = rules.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", parser_class=_Parser)
    rsub.required = True
    validate = rsub.add_parser("validate", help="check a rules file; exit 1 if invalid")
    validate.add_argument("file")
    queue = _queue_parser(sub)

    from stormguard.cli import simulate

    simulate_parser = simulate.add_parser(sub)
    p.subcommands = {"serve": serve, "check": check, "rules": rules, "queue": queue}
    p.subcommands["simulate"] = simulate_parser
    rules.subcommands = {"validate": validate}
    return p


def _queue_parser(sub: Any) -> argparse.ArgumentParser:
    """``stormguard queue stats|dead|retry-dead URL`` (the commands are in cli/queue.py)."""
    queue: _Parser = sub.add_parser(
        "queue", help="inspect a deferred-work queue",
        description="Inspect a DeferredQueue: sqlite:///path/file.db, redis://host:6379/0 "
        "(--stream) or redis+cluster://h1:p1,h2:p2. Exit 3 when the queue's storage fails.")
    qsub = queue.add_subparsers(dest="queue_command", metavar="SUBCOMMAND",
                                parser_class=_Parser)
    qsub.required = True
    helps = {"stats": "pending, in-flight and dead job counts (JSON)",
             "dead": "the dead letters: task, payload, attempts, last error",
             "retry-dead": "put every dead letter back to pending (attempts reset)"}
    for name, text in helps.items():
        cmd = qsub.add_parser(name, help=text, description=text)
        cmd.add_argument("url", help="the queue URL")
        cmd.add_argument("--stream", default=None,
                         help="Redis: the queue's stream name (default stormguard:deferred)")
        if name == "dead":
            cmd.add_argument("--json", action="store_true",
                             help="one JSON object per dead letter, one per line")
            cmd.add_argument("--limit", type=int, default=1000,
                             help="at most this many (default 1000)")
        queue.subcommands[name] = cmd
    return queue


def _load_rules(path: str | None) -> Any:
    from stormguard.ratelimit.rules import RuleSet

    if path is None:
        text = resources.files("stormguard.service").joinpath("default_rules.yaml").read_text(
            encoding="utf-8")
        return RuleSet.loads(text, source=SAMPLE_RULES)
    return RuleSet.load(path)


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"stormguard: error: {message}", file=sys.stderr)
    return code


class _Refused(Exception):
    """A configuration ``serve`` refuses (the message, and the exit code)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def redact(url: str) -> str:
    """A store URL without its password (``redis://user:***@host:6379/0``)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, host = rest.partition("@")
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{host}" if user or colon else url


def serve_setup(args: argparse.Namespace) -> tuple[Any, Any]:
    """What ``stormguard serve`` runs: ``(uvicorn.Config, limiter)``; logs which store and
    which rules are in force. Raises :class:`_Refused` for a configuration it refuses."""
    import uvicorn

    from stormguard.integrations.deployment import worker_count
    from stormguard.ratelimit.limiter import AsyncRateLimiter
    from stormguard.ratelimit.rules import RulesError
    from stormguard.service import create_app
    from stormguard.service.http import MAX_HEAD

    if args.rules is not None and args.sample_rules:
        raise _Refused("--rules and --sample-rules: give one of them")
    proxies = [p.strip() for p in (args.trusted_proxies or "").split(",") if p.strip()]
    try:
        from stormguard.integrations.clientip import ClientIP

        ClientIP(proxies)
    except ConfigError as exc:
        raise _Refused(f"--trusted-proxies: {exc.problem} (got {exc.value!r})") from None
    envoy = _envoy_setup(args)
    redis_store = args.store.split("://", 1)[0].lower() != "memory"
    rules: Any = None
    try:
        rules = _load_rules(args.rules) if args.rules is not None or args.sample_rules \
            or not redis_store else None
    except RulesError as exc:
        raise _Refused(_problems_text(exc)) from None
    try:
        limiter = AsyncRateLimiter(args.store, on_error=args.on_error)
    except ConfigError as exc:
        raise _Refused(str(exc)) from None
    store = redact(args.store)
    if redis_store:
        log.info("stormguard: store %s: counters shared by every instance on it", store)
        app = create_app(limiter, rules, rules_url=args.store, trusted_proxies=proxies)
        key = getattr(app.service.source, "key", "stormguard:rules")
        if args.rules is not None:
            log.info("stormguard: rules in Redis (%s on %s); %s seeds them if Redis holds "
                     "none", key, store, args.rules)
        elif args.sample_rules:
            log.warning("stormguard: rules in Redis (%s on %s); the packaged SAMPLE rules "
                        "seed them if Redis holds none (--sample-rules)", key, store)
        else:
            log.info("stormguard: rules in Redis (%s on %s), not seeded: an empty Redis "
                     "stays empty (seed it with --rules FILE, or --sample-rules for the "
                     "packaged sample rules)", key, store)
    else:
        workers = worker_count()
        log.info("stormguard: store %s: counters live in this process%s", store,
                 "" if workers is None or workers <= 1 else
                 f" (WARNING: {workers} workers: each counts on its own)")
        if args.rules is not None:
            app = create_app(limiter, rules_path=args.rules, trusted_proxies=proxies)
            log.info("stormguard: rules from %s (%d rules); control-plane edits are "
                     "written back to it", args.rules, len(rules))
        else:
            app = create_app(limiter, rules, trusted_proxies=proxies)
            log.warning("stormguard: serving the packaged SAMPLE rules (%s), an example, not "
                        "your limits: pass --rules FILE; control-plane edits stay in memory",
                        ", ".join(r.name for r in rules))
    if rules is not None and len(rules) == 0:
        log.warning("stormguard: the rules hold no rule: every check is allowed")
    _gateways_setup(args, app, limiter, envoy, proxies)
    # h11 by default: it bounds the request line + headers (MAX_HEAD bytes, then 400 and
    # close; httptools reads headers of any size), and parses a pipelined request only
    # after the one before it was answered (httptools parses ahead: junk after a request
    # closed the connection before that request, already charged, was answered).
    # proxy_headers=False: uvicorn's default would rewrite the client address from
    # X-Forwarded-For for connections from 127.0.0.1 (the service takes the client's
    # attributes from the check's body; nothing should trust a header for them)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            **_uvicorn_logging(args),
                            lifespan="on", timeout_graceful_shutdown=10,
                            server_header=False, http=args.http, proxy_headers=False,
                            h11_max_incomplete_event_size=MAX_HEAD)
    return config, limiter


JSON_LOG_CONFIG: dict[str, Any] = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"json": {"()": "stormguard.observability.logs.JsonFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json",
                            "stream": "ext://sys.stderr"}},
    "loggers": {name: {"handlers": ["stderr"], "level": "INFO", "propagate": False}
                for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
}
"""uvicorn's loggers as JSON lines too (``serve --log-format json``)."""


def _uvicorn_logging(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn.Config's logging options: its own by default, JSON lines with
    ``--log-format json``."""
    if getattr(args, "log_format", "text") == "json":
        return {"log_config": JSON_LOG_CONFIG}
    return {}


def _envoy_setup(args: argparse.Namespace) -> Any:
    """The Envoy configuration ``serve`` loads (None without ``--envoy-config``); refuses
    Envoy flags without ``--grpc-port``, and a missing ``grpc`` extra."""
    if args.grpc_port is None:
        for flag, given in (("--envoy-config", args.envoy_config is not None),
                            ("--envoy-headers", args.envoy_headers)):
            if given:
                raise _Refused(f"{flag} needs --grpc-port (the Envoy rate-limit service is "
                               "served over gRPC)")
        return None
    try:
        import grpc  # noqa: F401
        from envoy.service.ratelimit.v3 import rls_pb2  # noqa: F401
        from grpc_health.v1 import health  # noqa: F401
    except ImportError as exc:
        raise _Refused(f"--grpc-port needs grpcio and xds-protos (the 'grpc' extra): {exc}"
                       ) from None
    if args.grpc_port == args.port and args.port != 0:
        raise _Refused(f"--grpc-port {args.grpc_port}: the HTTP port (--port) already; give "
                       "the gRPC service a port of its own")
    if args.envoy_config is None:
        return None
    from stormguard.gateways.envoy import load_envoy_config

    try:
        return load_envoy_config(args.envoy_config)
    except ConfigError as exc:
        raise _Refused(f"--envoy-config: {exc}") from None


def _check_port_free(host: str, port: int) -> None:
    """Refuse a gRPC port that another process holds, before serving starts (the gRPC
    server binds it only in the app's start-up, where a failure is a traceback)."""
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            s.bind((host, port))
        except OSError as exc:
            raise _Refused(f"could not serve gRPC on {host}:{port}: {exc.strerror or exc} "
                           "(is the port in use?)", EXIT_LISTEN) from None


def _gateways_setup(args: argparse.Namespace, app: Any, limiter: Any, envoy: Any,
                    proxies: list[str]) -> None:
    """Log the trusted proxies; add the gRPC rate-limit service to the app."""
    if proxies:
        log.info("stormguard: /v1/auth believes X-Original-* / X-Real-IP from %s",
                 ", ".join(proxies))
    if args.grpc_port is not None:
        from stormguard.gateways.grpc import RateLimitServer

        _check_port_free(args.host, args.grpc_port)
        from stormguard.gateways.rls import EnvoyChecker

        checker = EnvoyChecker(limiter, envoy, app.service.source)
        app.service.companions.append(RateLimitServer(
            checker, args.grpc_port, args.host, headers=args.envoy_headers,
            metrics=app.service.metrics, top=app.service.top,
            observe=app.service.observe_degraded))
        if envoy is not None:
            from stormguard.gateways.watch import EnvoyConfigWatcher

            app.service.companions.append(EnvoyConfigWatcher(args.envoy_config, checker))
            log.info("stormguard: Envoy configuration from %s: domains %s (%d limits); "
                     "reloaded when its files change",
                     args.envoy_config, ", ".join(sorted(envoy.domains)), len(envoy.limits()))
        else:
            log.info("stormguard: no --envoy-config: the gRPC service answers the domain "
                     "'stormguard' from the rules, every other domain OK with no limit")


@contextlib.contextmanager
def _log_to_stderr(level: str, fmt: str = "text") -> Iterator[None]:
    """The service's own log lines (stormguard.*) to stderr, formatted like uvicorn's
    (``fmt="json"``: one JSON object per line), while ``serve`` runs."""
    from uvicorn.logging import DefaultFormatter

    from stormguard.observability.logs import JsonFormatter

    logger = logging.getLogger("stormguard")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         DefaultFormatter("%(levelprefix)s %(message)s"))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def _serve(args: argparse.Namespace) -> int:
    with _log_to_stderr(args.log_level, getattr(args, "log_format", "text")):
        return _run_server(args)


def _run_server(args: argparse.Namespace) -> int:
    import uvicorn

    try:
        config, limiter = serve_setup(args)
    except _Refused as exc:
        return _fail(str(exc), exc.code)
    server = uvicorn.Server(config)
    stopped_by: list[int] = []
    # uvicorn handles SIGTERM/SIGINT itself (stop accepting, finish in-flight requests,
    # run the shutdown) and then re-raises the signal to the previous handler: make that
    # handler record it, so a requested shutdown exits 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits 3 when it cannot bind: 3 is ours (store)
        if exc.code in (0, None):
            return 0
        return _fail(f"could not serve on {args.host}:{args.port} (the error is above: "
                     "is the port in use?)", EXIT_LISTEN)
    finally:
        limiter.store.close()
    return 0 if server.started else 1


def _problems_text(exc: Any) -> str:
    """A RulesError as text: the source, then one problem per line."""
    if len(exc.problems) == 1:
        return str(exc)
    lines = "\n".join(f"  {p}" for p in exc.problems)
    return f"{exc.source or 'rules'}: invalid, nothing applied:\n{lines}"


def _check(args: argparse.Namespace) -> int:
    from stormguard.ratelimit.rule import Rule
    from stormguard.ratelimit.rules import RulesError
    from stormguard.stores import from_url

    try:
        rules = _load_rules(args.rules)
    except RulesError as exc:
        return _fail(str(exc))
    spec = rules.get(args.rule)
    if spec is not None:
        rule = spec.rule
    else:
        try:
            rule = Rule.parse(args.rule, name=None)
        except ConfigError as exc:
            where = args.rules or SAMPLE_RULES
            if "/" in args.rule:  # meant as a limit: say what is wrong with it
                return _fail(f"rule {args.rule!r}: {exc.problem} (a rule like "
                             "'100/minute', or a rule name)")
            return _fail(f"rule: unknown rule {args.rule!r} (not in {where}, and not a rule "
                         f"like '100/minute': {exc.problem})")
    try:
        store = from_url(args.store)
    except ConfigError as exc:
        return _fail(str(exc))
    if args.store.split("://", 1)[0].lower() == "memory":
        print("stormguard: note: memory:// is a new, empty store in each run of "
              "`stormguard check` (nothing is remembered between runs; use --store "
              "redis://... to check against shared counters)", file=sys.stderr)
    try:
        d = store.hit(args.key, rule, args.cost)
    except ConfigError as exc:
        return _fail(str(exc))
    except StorageError as exc:
        return _fail(f"store {args.store}: {exc}", EXIT_STORE)
    finally:
        store.close()
    if args.json:
        out = d.to_dict()
        out["rule"] = rule.name or str(rule)
        out["key"] = args.key
        print(json.dumps(out))
    elif d.allowed:
        print(f"allowed: {args.key} under {rule}: {d.remaining} of {d.limit} left, "
              f"full again in {d.reset_after:.3f} s")
    else:
        print(f"denied: {args.key} under {rule}: retry after {d.retry_after:.3f} s")
    return 0 if d.allowed else EXIT_DENIED


def _validate(args: argparse.Namespace) -> int:
    from stormguard.ratelimit.rules import RulesError, RuleSet

    try:
        rules = RuleSet.load(args.file)
    except RulesError as exc:
        if exc.problems[0].field == "file":
            return _fail(f"{args.file}: {exc.problems[0].problem}")
        print(f"{args.file}: invalid, nothing would be applied:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    if not len(rules):
        print(f"{args.file}: no rules: the file holds no rule (served, it would allow every "
              "request)", file=sys.stderr)
        return 1
    print(f"{args.file}: {len(rules)} rules OK ({', '.join(r.name for r in rules)})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stormguard`` command (returns the exit code)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits for --help and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command == "serve":
        return _serve(args)
    if args.command == "check":
        return _check(args)
    if args.command == "queue":
        from stormguard.cli.queue import run

        return run(args)
    if args.command == "simulate":
        from stormguard.cli import simulate

        return simulate.run(args)
    return _validate(args)
