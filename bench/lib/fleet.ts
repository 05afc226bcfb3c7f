import type { ShimProcess } from "../../test/support/shim-process.js";
import { hasStatusCode } from "../../test/support/docker.js";
import { startTasks, type Bench } from "./harness.js";

/** The long-running workload of the fleet tasks. */
export const FLEET_COMMAND = ["sleep", "86400"];
/** Submits in flight at once while the fleet grows. */
const BATCH = 25;

/**
 * One shim with many running tasks, shared by B6 (memory), B4 (steady state), B5 (API
 * throughput) and B3 (recovery). `running` holds the ids of the tasks that should be running.
 */
export class Fleet {
  readonly running: string[] = [];
  private seq = 0;

  constructor(
    private readonly bench: Bench,
    public shim: ShimProcess,
  ) {}

  /** Submits new tasks, in parallel batches, until `size` are running. */
  async grow(size: number): Promise<void> {
    const count = size - this.running.length;
    if (count <= 0) return;
    const ids = Array.from({ length: count }, () => this.bench.name("fleet", this.seq++));
    await startTasks(this.bench, this.shim, ids, FLEET_COMMAND, BATCH);
    this.running.push(...ids);
  }

  /** Takes `count` tasks out of `running` (to be killed behind the shim's back); returns their container ids. */
  async takeVictims(count: number): Promise<{ ids: string[]; containers: string[] }> {
    const ids = this.running.splice(0, count);
    const containers = await Promise.all(ids.map(async (id) => (await this.shim.task(id)).container_id));
    return { ids, containers };
  }

  /** SIGKILLs containers through the Engine API and waits until Docker reports them exited. */
  async killContainers(containers: readonly string[]): Promise<void> {
    await Promise.all(
      containers.map(async (id) => {
        const container = this.bench.docker.getContainer(id);
        const exited = container.wait({ condition: "not-running" }) as Promise<unknown>;
        try {
          await container.kill({ signal: "SIGKILL" });
        } catch (error) {
          // 409: not running any more, which is what we wanted.
          if (!hasStatusCode(error, 409)) throw error;
        }
        await exited;
      }),
    );
  }
}
