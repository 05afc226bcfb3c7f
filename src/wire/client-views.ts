import type { Static } from "typebox";
import { Components, Healthcheck, InstanceInfo, TaskEvent, TaskInfo, TaskList } from "./schemas.js";
import { tolerant } from "./tolerant.js";

/*
 * What a client checks a shim's answers against: the server's schemas (schemas.ts) read
 * tolerantly (tolerant.ts). Required here is only what every shim the client may meet sends —
 * dstack-shim and every taskshim release — so an older shim's answer without an extension, or a
 * newer one's with a value added to an open enum, still reads; a field is added to the server's
 * schema and the client sees it, optional, without a second edit.
 */

/** `GET /api/healthcheck`: the extensions each optional (dstack-shim has none, 1.0.0 no `build`). */
export const HealthcheckView = tolerant(Healthcheck, [
  "service",
  "version",
  "engine.status",
  "storage.status",
  "lifecycle.phase",
  "lifecycle.since",
  // `build_id` tells two builds of one version apart; commit and dirty are informative.
  "build.build_id",
]);

/** `GET /api/tasks`. */
export const TaskListView = tolerant(TaskList, ["tasks", "tasks.id", "tasks.status"]);

/** `GET /api/tasks/{id}` and the other task answers: dstack-shim's core fields required. */
export const TaskInfoView = tolerant(TaskInfo, [
  "id",
  "status",
  "termination_reason",
  "termination_message",
  "ports.host",
  "ports.container",
  "image_pull_progress.downloaded_bytes",
  "image_pull_progress.extracted_bytes",
  "image_pull_progress.total_bytes",
  "image_pull_progress.is_total_bytes_final",
]);

/** One line of `GET /api/events`: only taskshim has the stream, so it is read as sent. */
export const TaskEventView = tolerant(TaskEvent, ["time", "kind", "id", "from", "to"]);

/** `GET /api/instance/info`: both fields optional on every shim. */
export const InstanceInfoView = tolerant(InstanceInfo);

/** `GET /api/components`. */
export const ComponentsView = tolerant(Components, [
  "components",
  "components.name",
  "components.version",
  "components.status",
]);

/** A healthcheck as a client reads it. */
export type HealthcheckReading = Static<typeof HealthcheckView>;
/** A task as a client reads it (the fields the control plane reads). */
export type TaskInfoReading = Static<typeof TaskInfoView>;
/** An event of the stream as a client reads it. */
export type TaskEventReading = Static<typeof TaskEventView>;
/** `GET /api/instance/info` as a client reads it. */
export type InstanceInfoReading = Static<typeof InstanceInfoView>;
/** One entry of `GET /api/components` as a client reads it. */
export type ComponentReading = Static<typeof ComponentsView>["components"][number];
