import type { ShimPullProgress, ShimTaskInfo } from "../control/shim-client.js";
import { formatBytes } from "./sizes.js";

/** Where progress is written: `process.stdout` or `process.stderr`, or a test double. */
export interface ProgressOutput {
  write(text: string): unknown;
  readonly isTTY?: boolean;
  readonly columns?: number;
}

/** A text bar of `width` cells for a fraction in [0, 1]: `[#######-------]`. */
export function progressBar(fraction: number, width: number): string {
  const clamped = Number.isFinite(fraction) ? Math.min(1, Math.max(0, fraction)) : 0;
  const inner = Math.max(1, width - 2);
  const done = Math.round(clamped * inner);
  return `[${"#".repeat(done)}${"-".repeat(inner - done)}]`;
}

/**
 * The byte counts of a pull in words: downloading first, then extracting once every byte is
 * down. A total that may still grow (a layer's size is not known yet) is marked with `+`.
 */
export function describePull(progress: ShimPullProgress | null | undefined): string {
  if (!progress) return "pulling (waiting for layer sizes)";
  const total = `${formatBytes(progress.total_bytes)}${progress.is_total_bytes_final ? "" : "+"}`;
  const downloaded = progress.total_bytes > 0 && progress.downloaded_bytes >= progress.total_bytes;
  if (downloaded && progress.extracted_bytes < progress.total_bytes) {
    return `extracting ${formatBytes(progress.extracted_bytes)} / ${total}`;
  }
  return `pulling ${formatBytes(progress.downloaded_bytes)} / ${total}`;
}

/**
 * The fraction of the pull that is done, by bytes over download and extraction together: each
 * byte counts once downloaded and once extracted, so a pull is 50 % when everything is down and
 * nothing extracted yet (the same figure as `Pulling N%` in `tasks ls`).
 */
export function pullFraction(progress: ShimPullProgress | null | undefined): number {
  if (!progress || progress.total_bytes <= 0) return 0;
  const total = progress.total_bytes;
  return (
    (Math.min(progress.downloaded_bytes, total) + Math.min(progress.extracted_bytes, total)) / (2 * total)
  );
}

const CLEAR_LINE = "\r\x1b[K";
const BAR_MAX_WIDTH = 32;
/** The widest a redrawn line gets; narrower terminals get their width less one column. */
const LINE_MAX_WIDTH = 72;

/**
 * One redraw of the bar, always exactly `lineWidth(columns)` characters wide whatever the
 * numbers say (a line that shrinks leaves stale characters on some terminals and jitters on
 * all): `[####----]  45% pulling 12.3 MB / 45.6 MB   `.
 */
export function barLine(progress: ShimPullProgress | null | undefined, columns: number): string {
  const width = lineWidth(columns);
  const percent = `${Math.floor(pullFraction(progress) * 100)}%`.padStart(4);
  const barWidth = Math.min(BAR_MAX_WIDTH, width - 30);
  const head =
    barWidth >= 10 ? `${progressBar(pullFraction(progress), barWidth)} ${percent} ` : `${percent} `;
  const room = width - head.length;
  const text = describePull(progress);
  const fitted = text.length > room ? `${text.slice(0, Math.max(0, room - 1))}…` : text.padEnd(room);
  return `${head}${fitted}`;
}

/** The width of every bar line on a terminal of `columns` (0 = unknown: 80). */
export function lineWidth(columns: number): number {
  return Math.max(20, Math.min(LINE_MAX_WIDTH, (columns || 80) - 1));
}

/**
 * Shows a submitted task's way to `running`: a line per status, and the pull as a redrawn bar
 * on a terminal or as at most one plain line per interval otherwise (logs and CI keep every
 * line, so a bar's carriage returns would only be noise there). The final status is left to
 * the caller, which knows what it means for the exit code.
 */
export class SubmitProgressView {
  private lastStatus: string | undefined;
  private lastPlainAt = Number.NEGATIVE_INFINITY;
  private barShown = false;
  private pulledShown = false;

  constructor(
    private readonly out: ProgressOutput,
    /** Monotonic: it only spaces the plain lines apart. */
    private readonly now: () => number = () => performance.now(),
    private readonly plainIntervalMs = 1_000,
  ) {}

  private get tty(): boolean {
    return this.out.isTTY === true;
  }

  /** Folds one poll of the task into the display. */
  update(task: ShimTaskInfo): void {
    const progress = task.image_pull_progress ?? null;
    if (task.status !== this.lastStatus) {
      const previous = this.lastStatus;
      this.lastStatus = task.status;
      if (previous === "pulling" || (task.status !== "pulling" && progress !== null))
        this.showPulled(progress);
      if (task.status === "pulling") this.showPull(progress, true);
      else if (task.status === "preparing" || task.status === "creating") this.line(task.status);
      return;
    }
    if (task.status === "pulling") this.showPull(progress, false);
  }

  /**
   * Ends the display: a bar still drawn is replaced by the pull's final numbers, or cleared
   * (a failed or interrupted pull leaves no half-drawn bar behind).
   */
  end(task: ShimTaskInfo | undefined): void {
    if (task && !this.pulledShown && (task.image_pull_progress ?? null) !== null) {
      this.showPulled(task.image_pull_progress ?? null);
    }
    this.clearBar();
  }

  private clearBar(): void {
    if (this.barShown) {
      this.out.write(CLEAR_LINE);
      this.barShown = false;
    }
  }

  private line(text: string): void {
    this.clearBar();
    this.out.write(`${text}\n`);
  }

  private showPull(progress: ShimPullProgress | null, first: boolean): void {
    const text = describePull(progress);
    if (this.tty) {
      // A pseudo-terminal without a window size reports 0 columns.
      this.out.write(`${CLEAR_LINE}${barLine(progress, this.out.columns ?? 0)}`);
      this.barShown = true;
      return;
    }
    // Unchanged numbers still get their line each interval: a stalled pull should look stalled.
    const now = this.now();
    if (!first && now - this.lastPlainAt < this.plainIntervalMs) return;
    this.lastPlainAt = now;
    this.out.write(`${text}\n`);
  }

  /** The pull's last numbers: `pulled N` when complete, else where it stopped (a failed pull). */
  private showPulled(progress: ShimPullProgress | null): void {
    if (this.pulledShown || progress === null) return;
    this.pulledShown = true;
    const complete =
      progress.is_total_bytes_final &&
      progress.total_bytes > 0 &&
      progress.extracted_bytes >= progress.total_bytes;
    this.line(complete ? `pulled ${formatBytes(progress.total_bytes)}` : describePull(progress));
  }
}
