"""TCP helpers of the tests that try to reach a job's ports (run inside a host's namespace):

    python ports.py connect ADDRESS PORT...   prints {"PORT": outcome} as JSON, outcome
                                              "connected", "refused", "timeout" or the
                                              errno's name (e.g. "ENETUNREACH")
    python ports.py listen ADDRESS            binds a free port on ADDRESS, prints it, and
                                              listens until stdin closes

A connection is closed as soon as it is made, without sending anything."""
import errno
import json
import socket
import sys

TIMEOUT_SECONDS = 3.0


def connect(address, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT_SECONDS)
        try:
            s.connect((address, port))
        except ConnectionRefusedError:
            return "refused"
        except socket.timeout:
            return "timeout"
        except OSError as error:
            return errno.errorcode.get(error.errno, str(error))
        return "connected"


def listen(address):
    """A listener the test controls; the kernel completes connections to it from its backlog,
    so nothing needs to accept them while stdin is open."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        s.listen(16)
        print(s.getsockname()[1], flush=True)
        sys.stdin.read()


def main(argv):
    if argv[:1] == ["connect"] and len(argv) >= 3:
        print(json.dumps({port: connect(argv[1], int(port)) for port in argv[2:]}))
    elif argv[:1] == ["listen"] and len(argv) == 2:
        listen(argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
