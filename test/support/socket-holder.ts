// What systemd does for a socket-activated service (deploy/taskshim.socket), for tests. This
// process is started with a listening TCP socket as fd 3 (the test binds it, passes it, and closes
// its own copy: node accepts on every socket it listens on, so the binder cannot be the holder).
// It never touches fd 3; it starts the command with that socket as fd 3 and LISTEN_FDS=1; on a
// line "restart" on stdin it SIGKILLs the command, waits GAP_MS with no process serving at all,
// and starts it again; at the end of stdin it stops the command with SIGTERM. It prints
// "started <pid>" after every start and "killed" after every kill.
//   node socket-holder.ts GAP_MS -- COMMAND...   (node runs it with its own type stripping)
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

const gapMs = Number(process.argv[2]);
const [cmd, ...args] = process.argv.slice(process.argv.indexOf("--") + 1);
if (cmd === undefined) throw new Error("usage: socket-holder.ts GAP_MS -- COMMAND...");
const start = (): ChildProcess => {
  const child = spawn(cmd, args, {
    stdio: ["ignore", "inherit", "inherit", 3],
    env: { ...process.env, LISTEN_FDS: "1" },
  });
  console.log(`started ${child.pid}`);
  return child;
};

let child = start();
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() !== "restart") continue;
  child.kill("SIGKILL");
  await once(child, "exit");
  console.log("killed");
  await sleep(gapMs);
  child = start();
}
child.kill("SIGTERM");
await once(child, "exit");
