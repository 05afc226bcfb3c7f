import { execFileSync } from "node:child_process";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * Tenstorrent and Intel Gaudi end to end on a machine with neither: GPU fixtures stand in for
 * the hosts' accelerators. Tenstorrent's device nodes are harmless character devices (1:3, the
 * same as /dev/null) and its huge page mount a plain directory, so the engine really passes them
 * into the container. Gaudi's `habana` runtime does not exist here: the engine refuses the
 * create, and what is proven is the create request the shim sent (recorded by a pass-through
 * proxy in front of the engine) and the task's honest error.
 */

/** dstack's task id label, which the create body carries. */
const LABEL_TASK_ID = "ai.dstack.shim.task-id";

let images: TestImages;
let seq = 0;

function gpuTask(gpu: number, command: string[]) {
  seq += 1;
  return {
    id: `gpuv-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-gpuv-${seq}`,
    image_name: images.busybox,
    gpu,
    command,
  };
}

beforeAll(async () => {
  images = await ensureTestImages();
});

describe("Tenstorrent from a fixture", () => {
  let shim: ShimProcess;
  let dir: string;
  let fixture: string;

  beforeAll(async () => {
    dir = await tempHome("taskshim-tt-");
    for (const node of ["tt0", "tt1"]) execFileSync("mknod", [join(dir, node), "c", "1", "3"]);
    await mkdir(join(dir, "hugepages-1G"));
    fixture = join(dir, "gpus.json");
    await writeFile(
      fixture,
      JSON.stringify({
        vendor: "tenstorrent",
        driver_version: "2.0.0",
        hugepages_path: join(dir, "hugepages-1G"),
        gpus: [
          { name: "n300", vram_mib: 24576, device_node: join(dir, "tt0") },
          { name: "n300", vram_mib: 24576, device_node: join(dir, "tt1") },
        ],
      }),
    );
    shim = await ShimProcess.start({ args: ["--gpu-fixture", fixture] });
  });

  afterAll(async () => {
    await shim?.stop();
  });

  it("names the vendor in instance info and metrics", async () => {
    expect((await shim.request("GET", "/api/instance/info")).json).toEqual({
      gpu_vendor: "tenstorrent",
      gpu_driver_version: "2.0.0",
    });
    expect((await shim.request("GET", "/metrics")).text).toMatch(
      /^taskshim_gpus\{vendor="tenstorrent"\} 2$/m,
    );
  });

  it("gives a locked chip's device node and the huge pages to the container, and keeps it across a restart", async () => {
    const holder = gpuTask(1, ["sleep", "300"]);
    await shim.submit(holder);
    const running = await shim.waitTask(holder.id, (t) => t.status === "running");
    expect(running.gpus_ids).toEqual(["0"]);
    const info = await testDocker().getContainer(running.container_id).inspect();
    expect(info.HostConfig.Devices).toEqual([
      { PathOnHost: join(dir, "tt0"), PathInContainer: "/dev/tenstorrent/0", CgroupPermissions: "rwm" },
    ]);
    const mounts = (info.HostConfig.Mounts ?? []) as { Type: string; Source: string; Target: string }[];
    expect(mounts.filter((m) => m.Target === "/dev/hugepages-1G")).toEqual([
      expect.objectContaining({
        Type: "bind",
        Source: join(dir, "hugepages-1G"),
        Target: "/dev/hugepages-1G",
      }),
    ]);

    // The other chip, seen from inside: its node and the huge page mount are there.
    const other = gpuTask(1, [
      "sh",
      "-c",
      "ls /dev/tenstorrent; test -d /dev/hugepages-1G && echo hugepages; exit 1",
    ]);
    await shim.submit(other);
    const done = await shim.waitTask(other.id, (t) => t.status === "terminated" && t.gpus_ids?.length === 0);
    expect(done.termination_message.split("\n")).toEqual(["1", "hugepages"]);

    // A restart reads the holder's chip back from its container's devices and locks it again.
    await shim.kill();
    shim = await ShimProcess.start({ home: shim.home, args: ["--gpu-fixture", fixture] });
    const restored = await shim.task(holder.id);
    expect(restored.status).toBe("running");
    expect(restored.gpus_ids).toEqual(["0"]);
    const greedy = gpuTask(2, ["true"]);
    await shim.submit(greedy);
    expect((await shim.waitTerminated(greedy.id)).termination_message).toBe(
      "no capacity: 2 GPUs requested, 1 available",
    );
    await shim.terminate(holder.id);
  });
});

/** A pass-through proxy to the engine that keeps the body of every container create. */
async function recordingProxy(
  socketPath: string,
): Promise<{ creates: Record<string, unknown>[]; stop: () => Promise<void> }> {
  const host = process.env.DOCKER_HOST ?? "";
  const upstreamPath = host.startsWith("unix://") ? host.slice("unix://".length) : "/var/run/docker.sock";
  const creates: Record<string, unknown>[] = [];
  await rm(socketPath, { force: true });
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      if (req.method === "POST" && /\/containers\/create(\?|$)/.test(req.url ?? "")) {
        creates.push(JSON.parse(body.toString("utf8")) as Record<string, unknown>);
      }
      const upstream = request(
        { socketPath: upstreamPath, path: req.url, method: req.method, headers: req.headers },
        (up) => {
          res.writeHead(up.statusCode ?? 502, up.headers);
          up.pipe(res);
        },
      );
      upstream.on("error", () => res.destroy());
      upstream.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  return {
    creates,
    stop: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

describe("Intel Gaudi from a fixture", () => {
  let shim: ShimProcess;
  let proxy: Awaited<ReturnType<typeof recordingProxy>>;

  beforeAll(async () => {
    const dir = await tempHome("taskshim-gaudi-");
    const fixture = join(dir, "gpus.json");
    await writeFile(
      fixture,
      JSON.stringify({
        vendor: "intel",
        driver_version: "",
        gpus: [
          { name: "HL-225", vram_mib: 98304 },
          { name: "HL-225", vram_mib: 98304 },
        ],
      }),
    );
    proxy = await recordingProxy(join(dir, "engine.sock"));
    shim = await ShimProcess.start({
      args: ["--gpu-fixture", fixture],
      env: { DOCKER_HOST: `unix://${join(dir, "engine.sock")}` },
    });
  });

  afterAll(async () => {
    await shim?.stop();
    await proxy?.stop();
  });

  it("names the vendor in instance info", async () => {
    expect((await shim.request("GET", "/api/instance/info")).json).toEqual({
      gpu_vendor: "intel",
      gpu_driver_version: "",
    });
  });

  it("asks the engine for the habana runtime with the card's index; an engine without it refuses, and the task says so", async () => {
    const task = gpuTask(1, ["true"]);
    await shim.submit(task);
    const done = await shim.waitTask(task.id, (t) => t.status === "terminated" && t.gpus_ids?.length === 0);
    expect(done.termination_reason).toBe("creating_container_error");
    // Docker names the runtime it does not know; the message is the engine's own.
    expect(done.termination_message).toMatch(/^createContainer error: create: .*habana/);
    const created = proxy.creates.filter(
      (body) => (body.Labels as Record<string, string>)[LABEL_TASK_ID] === task.id,
    );
    expect(created).toHaveLength(1);
    const hostConfig = created[0]?.HostConfig as Record<string, unknown>;
    expect({
      Runtime: hostConfig.Runtime,
      IpcMode: hostConfig.IpcMode,
      CapAdd: hostConfig.CapAdd,
      Devices: hostConfig.Devices,
      DeviceRequests: hostConfig.DeviceRequests,
      habana: (created[0]?.Env as string[]).filter((e) => e.startsWith("HABANA_")),
    }).toEqual({
      Runtime: "habana",
      IpcMode: "host",
      CapAdd: ["SYS_NICE"],
      Devices: undefined,
      DeviceRequests: undefined,
      habana: ["HABANA_VISIBLE_DEVICES=0"],
    });

    // The refused task released its card: both are free for the next one.
    const both = gpuTask(-1, ["true"]);
    await shim.submit(both);
    await shim.waitTerminated(both.id);
    const last = proxy.creates.at(-1);
    expect((last?.Env as string[]).filter((e) => e.startsWith("HABANA_"))).toEqual([
      "HABANA_VISIBLE_DEVICES=0,1",
    ]);
  });
});
