"""torchrun at node rank 0 whose rendezvous store listens on one address only (host 0 of several hosts).

`python -m backend.controller.bound_torchrun ADDRESS <torchrun arguments>`. torchrun's store (a TCPStore) binds
every interface and has no option to choose one. Static rendezvous creates it as a multi-tenant server, which
torch shares per process and port, so a store made here first, on a socket bound to ADDRESS, is the one
torchrun then uses. Static rendezvous keeps only counters and addresses in it, never pickled state.
"""

from __future__ import annotations

import datetime
import socket
import sys


def main(argv: list[str]) -> None:
    import torch.distributed as dist
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import main as torchrun

    address, args = argv[0], argv[1:]
    parsed, _ = get_args_parser().parse_known_args(args)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, parsed.master_port))
    store = dist.TCPStore(address, sock.getsockname()[1], None, True, datetime.timedelta(seconds=600),
                          wait_for_workers=False, multi_tenant=True, master_listen_fd=sock.detach())
    sys.argv = ["torchrun", *args]
    try:
        torchrun(args)
    finally:
        del store


if __name__ == "__main__":
    main(sys.argv[1:])
