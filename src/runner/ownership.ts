import type { Logger } from "pino";
import { isValidTaskId } from "../tasks/task-config.js";

/** The facts about a labelled container that decide whose it is. */
export interface OwnedContainerFacts {
  readonly id: string;
  readonly name: string;
  readonly taskId: string;
  /** Its owner label; "" when it has none. */
  readonly owner: string;
}

/**
 * Whose a labelled container is:
 * - `own`: its owner label is this home's identity;
 * - `handover`: no owner label, and this home holds a task.json of its task id (written by
 *   dstack-shim >= 0.21.3 or by a taskshim from before the owner label);
 * - `unowned-adopted`: no owner label, no task.json, and the operator asked for such containers
 *   (`--adopt-unowned`): its config is unknown, its volumes come from its mounts. Only a task
 *   label the submit would accept as an id (or none) is adopted: the task.json written for it
 *   must read back at the next start, and its id must work in the API's paths;
 * - `foreign`: everything else: another home's container, or one nobody here claims.
 */
export type Ownership = "own" | "handover" | "unowned-adopted" | "foreign";

/**
 * The one ownership rule, used by the restore, the reconciler, the event stream and the
 * create path alike. A foreign container is never listed, finalized, stopped, removed or
 * counted as degraded; it is counted (`taskshim_foreign_containers`) and logged once.
 */
export class ContainerOwnership {
  private readonly logged = new Set<string>();

  constructor(
    /** This home's identity (the owner label this shim writes). */
    readonly homeId: string,
    /** `--adopt-unowned`: containers without owner label or task.json are taken as ours. */
    readonly adoptUnowned: boolean,
    private readonly log?: Logger,
    private readonly onForeignCount?: (count: number) => void,
  ) {}

  /**
   * Classifies one container. `hasTaskState(id)` says whether this home holds a task.json of
   * that task id (at startup: the scan of task dirs; later: the task store, which mirrors it).
   */
  classify(container: OwnedContainerFacts, hasTaskState: (taskId: string) => boolean): Ownership {
    if (container.owner !== "") return container.owner === this.homeId ? "own" : "foreign";
    if (container.taskId !== "" && hasTaskState(container.taskId)) return "handover";
    return this.adoptUnowned && adoptable(container.taskId) ? "unowned-adopted" : "foreign";
  }

  /** Whether the container is this shim's (any verdict but `foreign`). */
  isOurs(container: OwnedContainerFacts, hasTaskState: (taskId: string) => boolean): boolean {
    return this.classify(container, hasTaskState) !== "foreign";
  }

  /**
   * Keeps the containers that are this shim's, counts the others in the metric, and logs each
   * foreign container once per process.
   */
  filter<C extends OwnedContainerFacts>(
    containers: readonly C[],
    hasTaskState: (taskId: string) => boolean,
  ): C[] {
    const ours: C[] = [];
    let foreign = 0;
    for (const container of containers) {
      if (this.isOurs(container, hasTaskState)) {
        ours.push(container);
        continue;
      }
      foreign++;
      if (!this.logged.has(container.id)) {
        this.logged.add(container.id);
        this.log?.info(
          {
            container: container.name,
            containerId: container.id,
            taskId: container.taskId,
            owner: container.owner,
          },
          container.owner !== ""
            ? "container of another taskshim home left alone"
            : this.adoptUnowned
              ? "container without owner label not adopted: its task label is not a valid task id"
              : "labelled container without owner label and without task state here left alone (see --adopt-unowned)",
        );
      }
    }
    this.onForeignCount?.(foreign);
    return ours;
  }
}

/** A task label an adoption can take: a valid id, or none (such a container is then ignored). */
function adoptable(taskId: string): boolean {
  return taskId === "" || isValidTaskId(taskId);
}
