"""``stormguard queue stats|dead|retry-dead URL``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from stormguard._core.errors import ConfigError, StorageError

__all__ = ["run"]

EXIT_USAGE = 2
EXIT_STORE = 3


def run(args: argparse.Namespace) -> int:
    from stormguard.queue import DeferredQueue

    options = {} if args.stream is None else {"stream": args.stream}
    if args.url.lower().startswith("sqlite://"):
        path = args.url.split("://", 1)[1]
        if path and not os.path.exists(path):
            print(f"stormguard: error: {args.url}: no such queue file ({path})",
                  file=sys.stderr)
            return EXIT_USAGE
    try:
        queue = DeferredQueue(args.url, **options)
    except (ConfigError, TypeError) as exc:
        print(f"stormguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StorageError as exc:
        print(f"stormguard: error: queue {args.url}: {exc}", file=sys.stderr)
        return EXIT_STORE
    if not queue.durable:
        print("stormguard: note: memory:// is a new, empty queue in each run of the command",
              file=sys.stderr)
    try:
        if args.queue_command == "stats":
            print(json.dumps(queue.stats()))
        elif args.queue_command == "dead":
            letters = queue.dead(args.limit)
            for d in letters:
                if args.json:
                    print(json.dumps(d.to_dict(), ensure_ascii=False))
                else:
                    print(f"{d.id}\t{d.task}\tattempts={d.attempts}\t{d.error}\t"
                          f"{json.dumps(d.payload, ensure_ascii=False)}")
            if not args.json:
                print(f"{len(letters)} dead letters", file=sys.stderr)
        else:
            n = queue.retry_dead()
            print(f"{n} dead letters back to pending")
    except ConfigError as exc:
        print(f"stormguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StorageError as exc:
        print(f"stormguard: error: queue {args.url}: {exc}", file=sys.stderr)
        return EXIT_STORE
    finally:
        queue.close()
    return 0
