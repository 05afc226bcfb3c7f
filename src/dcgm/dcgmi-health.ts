import { OperationBound } from "../exec/operation-bound.js";
import { CommandFailedError, type CommandRunner } from "../exec/run-bounded.js";
import {
  DCGM_HEALTH,
  type DcgmHealth,
  type DcgmHealthIncident,
  type DcgmHealthResult,
  type GpuHealthSource,
} from "./ports.js";

/*
 * GPU health from `dcgmi`, DCGM's own command line tool, instead of libdcgm in the shim's process.
 * dstack-shim links libdcgm through cgo (runner/internal/shim/dcgm/wrapper_cgo.go); from Node
 * that would be a native addon, and a fault in it (a crash, a hang in the library's threads)
 * would take the whole shim down with every task's API. A command is bounded, killed with its
 * process group at the deadline, and its failure is a null health, nothing more.
 *
 * `dcgmi` talks to nv-hostengine (`--host`, localhost by default); it cannot embed a host engine,
 * so without `--dcgm-address` the host's nv-hostengine service must run. The watches are set
 * (`dcgmi health -s a`) at the first check and again whenever dcgmi says they are not set (a
 * restarted nv-hostengine forgets them); a check is `dcgmi health -c -j`.
 */

/** The text dcgmi prints when no watch is set on the group. */
const WATCHES_NOT_ENABLED = /health watches not enabled/i;

/** A health check dcgmi answered with something this parser cannot read. */
export class DcgmiOutputError extends Error {
  override readonly name = "DcgmiOutputError";
}

/** dcgmi's system names (Health.cpp's HelperSystemToString) → `DCGM_HEALTH_WATCH_*` bits. */
const SYSTEMS: Readonly<Record<string, number>> = {
  "PCIe system": 0x1,
  "NVLINK system": 0x2,
  "PMU system": 0x4,
  "MCU system": 0x8,
  "Memory system": 0x10,
  "SM system": 0x20,
  "InfoROM system": 0x40,
  "Thermal system": 0x80,
  "Power system": 0x100,
  Driver: 0x200,
  "NvSwitch NF": 0x400,
  "NvSwitch F": 0x800,
};

/** DCGM's entity group names (DcgmFieldsGetEntityGroupString) → `DCGM_FE_*`. */
const ENTITY_GROUPS: Readonly<Record<string, number>> = {
  None: 0,
  GPU: 1,
  vGPU: 2,
  Switch: 3,
  GPU_I: 4,
  GPU_CI: 5,
  Link: 6,
  CPU: 7,
  CPU_CORE: 8,
};

function resultOf(text: unknown, where: string): DcgmHealthResult {
  switch (typeof text === "string" ? text.trim().toLowerCase() : "") {
    case "healthy":
      return DCGM_HEALTH.pass;
    case "warning":
      return DCGM_HEALTH.warn;
    case "failure":
      return DCGM_HEALTH.fail;
    default:
      throw new DcgmiOutputError(`unreadable health ${JSON.stringify(text)} at ${where}`);
  }
}

type Node = { value?: unknown; overflow?: unknown; children?: Record<string, Node> };

const isNode = (value: unknown): value is Node =>
  typeof value === "object" && value !== null && !Array.isArray(value);

/**
 * Parses `dcgmi health -c -j`: `{"header": [...], "body": {"Overall Health": {"value": …},
 * "<entity group>": {"children": {"<id>": {"value": …, "children": {"Errors": {"children":
 * {"<system>": {"value": …, "overflow": [message parts]}}}}}}}}}`. dcgmi joins one system's
 * incidents into one message and drops DCGM's error codes: one incident per entity and system,
 * `error_code` 0.
 *
 * @throws DcgmiOutputError when it is not that shape.
 */
export function parseDcgmiHealth(stdout: string): DcgmHealth {
  let parsed: unknown;
  try {
    parsed = JSON.parse(stdout);
  } catch (error) {
    throw new DcgmiOutputError("dcgmi printed no JSON", { cause: error });
  }
  const body = isNode(parsed) ? (parsed as { body?: unknown }).body : undefined;
  if (!isNode(body)) throw new DcgmiOutputError("dcgmi's answer has no body");
  const overall = (body as Record<string, unknown>)["Overall Health"];
  const overallHealth = resultOf(isNode(overall) ? overall.value : undefined, "Overall Health");
  const incidents: DcgmHealthIncident[] = [];
  for (const [groupName, group] of Object.entries(body as Record<string, unknown>)) {
    if (groupName === "Overall Health") continue;
    const groupId = ENTITY_GROUPS[groupName];
    if (groupId === undefined || !isNode(group)) continue;
    for (const [entity, node] of Object.entries(group.children ?? {})) {
      const entityId = Number(entity);
      if (!Number.isSafeInteger(entityId) || !isNode(node)) continue;
      const errors = node.children?.["Errors"];
      for (const [systemName, system] of Object.entries(errors?.children ?? {})) {
        const parts = Array.isArray(system.overflow)
          ? system.overflow.filter((p): p is string => typeof p === "string")
          : [];
        incidents.push({
          system: SYSTEMS[systemName] ?? 0,
          health: resultOf(system.value, `${groupName} ${entity} ${systemName}`),
          error_message: parts.join(" ").replace(/\s+/g, " ").trim(),
          error_code: 0,
          entity_group_id: groupId,
          entity_id: entityId,
        });
      }
    }
  }
  return { overall_health: overallHealth, incidents };
}

/** Options of {@link DcgmiHealthSource}. */
export interface DcgmiOptions {
  /** `--dcgm-address`: nv-hostengine's address; "" for the local one. */
  readonly address: string;
  /** One dcgmi call's deadline (the monitor's deadline bounds a whole check too). */
  readonly callMs?: number;
  /** The dcgmi executable. */
  readonly executable?: string;
}

/** The health source over `dcgmi` (see the top of this file). */
export class DcgmiHealthSource implements GpuHealthSource {
  readonly name = "dcgmi";
  private watchesSet = false;

  constructor(
    private readonly commands: CommandRunner,
    private readonly options: DcgmiOptions,
  ) {}

  private argv(...args: string[]): string[] {
    const host = this.options.address === "" ? [] : ["--host", this.options.address];
    return [this.options.executable ?? "dcgmi", "health", ...host, ...args];
  }

  private async call(args: string[], signal: AbortSignal): Promise<string> {
    const argv = this.argv(...args);
    const outcome = await this.commands.run({
      argv,
      bound: OperationBound.within(this.options.callMs ?? 10_000),
    });
    if (signal.aborted) throw new DcgmiOutputError("the check was abandoned");
    if (outcome.kind === "exited" && outcome.code === 0) return outcome.stdout.toString("utf8");
    // dcgmi prints its errors on stdout.
    if (outcome.kind === "exited" && WATCHES_NOT_ENABLED.test(outcome.stdout.toString("utf8"))) return "";
    throw new CommandFailedError(argv, outcome);
  }

  async check(signal: AbortSignal): Promise<DcgmHealth> {
    if (!this.watchesSet) {
      await this.call(["-s", "a"], signal);
      this.watchesSet = true;
    }
    const out = await this.call(["-c", "-j"], signal);
    if (out === "" || WATCHES_NOT_ENABLED.test(out)) {
      // nv-hostengine restarted and forgot the watches: set them again; the next check reads them.
      this.watchesSet = false;
      throw new DcgmiOutputError("DCGM health watches were not set; set again for the next check");
    }
    return parseDcgmiHealth(out);
  }
}
