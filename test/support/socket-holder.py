# What systemd does for a socket-activated service (deploy/taskshim.socket), for tests: hold one
# listening TCP socket and never accept on it; start the command with that socket as fd 3 and
# LISTEN_FDS=1; on a line "restart" on stdin, SIGKILL the command, wait the given gap with no
# process serving at all, and start it again. Prints "started <pid>" after every start.
#   python3 socket-holder.py PORT GAP_MS -- COMMAND...
import os, signal, socket, subprocess, sys, time

port, gap_ms = int(sys.argv[1]), int(sys.argv[2])
command = sys.argv[sys.argv.index("--") + 1:]
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(128)
fd = listener.fileno()

def as_fd3():
    os.dup2(fd, 3)
    os.set_inheritable(3, True)

def start():
    env = dict(os.environ, LISTEN_FDS="1")
    child = subprocess.Popen(command, env=env, preexec_fn=as_fd3, close_fds=False)
    print(f"started {child.pid}", flush=True)
    return child

child = start()
for line in sys.stdin:
    if line.strip() == "restart":
        child.send_signal(signal.SIGKILL)
        child.wait()
        print("killed", flush=True)
        time.sleep(gap_ms / 1000)
        child = start()
child.send_signal(signal.SIGTERM)
child.wait()
