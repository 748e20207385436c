"""The ``stormguard`` command: ``serve``, ``check``, ``rules validate``.

Exit codes: 0 success (``check``: allowed), 1 denied or invalid rules, 2 bad usage
(flags, unreadable files, bad configuration), 3 the store failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any, NoReturn

from stormguard._core.errors import ConfigError, StorageError

__all__ = ["main"]

EXIT_DENIED = 1
EXIT_USAGE = 2
EXIT_STORE = 3
SAMPLE_RULES = "<packaged sample rules>"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


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


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="stormguard", description="stormguard: rate limiting as a service.")
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
                       help="rules file (YAML); control-plane edits rewrite it. Default: "
                       "the packaged sample rules [env STORMGUARD_RULES]")
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
    serve.add_argument("--log-level", default=_env("STORMGUARD_LOG_LEVEL", "info"),
                       choices=("critical", "error", "warning", "info", "debug"),
                       help="[env STORMGUARD_LOG_LEVEL]")

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
    return p


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


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from stormguard.ratelimit.limiter import AsyncRateLimiter
    from stormguard.ratelimit.rules import RulesError
    from stormguard.service import create_app
    from stormguard.service.http import MAX_HEAD

    try:
        rules = _load_rules(args.rules)
    except RulesError as exc:
        return _fail(str(exc))
    try:
        limiter = AsyncRateLimiter(args.store, on_error=args.on_error)
    except ConfigError as exc:
        return _fail(str(exc))
    redis_store = args.store.split("://", 1)[0].lower() != "memory"
    if redis_store:
        app = create_app(limiter, rules, rules_url=args.store)
    elif args.rules is not None:
        app = create_app(limiter, rules_path=args.rules)
    else:
        app = create_app(limiter, rules)
    # h11 by default: it bounds the request line + headers (MAX_HEAD bytes, then 400 and
    # close; httptools reads headers of any size), and parses a pipelined request only
    # after the one before it was answered (httptools parses ahead: junk after a request
    # closed the connection before that request, already charged, was answered)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            lifespan="on", timeout_graceful_shutdown=10,
                            server_header=False, http=args.http,
                            h11_max_incomplete_event_size=MAX_HEAD)
    server = uvicorn.Server(config)
    stopped_by: list[int] = []
    # uvicorn handles SIGTERM/SIGINT itself (stop accepting, finish in-flight requests,
    # run the shutdown) and then re-raises the signal to the previous handler: make that
    # handler record it, so a requested shutdown exits 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped_by.append(signum))
    try:
        server.run()
    finally:
        limiter.store.close()
    return 0 if server.started else 1


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
        except ConfigError:
            where = args.rules or SAMPLE_RULES
            return _fail(f"rule: unknown rule {args.rule!r} (not in {where}, and not a rule "
                         "like '100/minute')")
    try:
        store = from_url(args.store)
    except ConfigError as exc:
        return _fail(str(exc))
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
    return _validate(args)
