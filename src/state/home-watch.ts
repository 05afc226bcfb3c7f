import { constants } from "node:fs";
import { open, stat, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "pino";
import { readBoundedFile } from "./bounded-read.js";
import { HOME_ID_FILE, HOME_ID_MAX_BYTES } from "./home-identity.js";

/** How often the home is checked: a deleted or replaced home is noticed within this (< 5 s). */
export const HOME_WATCH_INTERVAL_MS = 2_000;

/** Whether the home this shim started on is still the one on disk. */
export type HomeHealth =
  { readonly status: "ok" } | { readonly status: "degraded"; readonly since: number; readonly error: string };

/**
 * Watches the home for deletion or replacement (another directory, or another identity, at
 * the same path): the state files the shim writes would then go nowhere a restart finds them.
 * The lock cannot be taken over meanwhile (it is not a file), so this only has to be seen:
 * logged once per change and reported in the healthcheck.
 */
export class HomeWatch {
  private health: HomeHealth = { status: "ok" };
  private timer: NodeJS.Timeout | undefined;
  private checking: Promise<void> | undefined;

  private constructor(
    private readonly home: string,
    private readonly homeId: string,
    /**
     * The home directory held open: its inode cannot be reused while held, so a directory
     * created at the same path after a delete is always told apart, and a deleted one shows
     * a link count of 0.
     */
    private readonly held: FileHandle,
    private readonly identity: { readonly dev: number; readonly ino: number },
    private readonly log: Logger,
  ) {}

  /** Records what the home is now and starts checking it every `intervalMs`. */
  static async start(
    home: string,
    homeId: string,
    log: Logger,
    intervalMs = HOME_WATCH_INTERVAL_MS,
  ): Promise<HomeWatch> {
    const held = await open(home, constants.O_RDONLY | constants.O_DIRECTORY);
    const info = await held.stat();
    const watch = new HomeWatch(home, homeId, held, { dev: info.dev, ino: info.ino }, log);
    watch.timer = setInterval(() => void watch.check(), intervalMs);
    watch.timer.unref();
    return watch;
  }

  /** The last check's verdict. */
  current(): HomeHealth {
    return this.health;
  }

  /** Checks the home once (the timer calls it; tests may too). */
  check(): Promise<void> {
    this.checking ??= this.checkOnce().finally(() => (this.checking = undefined));
    return this.checking;
  }

  private async checkOnce(): Promise<void> {
    const problem = await this.problem();
    if (problem === undefined) {
      if (this.health.status === "degraded") this.log.info({ home: this.home }, "home is back as it was");
      this.health = { status: "ok" };
      return;
    }
    if (this.health.status === "degraded" && this.health.error === problem) return;
    this.health = { status: "degraded", since: Date.now(), error: problem };
    this.log.error(
      { home: this.home, problem },
      "the shim's home was deleted or replaced: task state written now is lost to a restart",
    );
  }

  private async problem(): Promise<string | undefined> {
    const heldInfo = await this.held.stat().catch(() => undefined);
    if (heldInfo?.nlink === 0) {
      const recreated = await stat(this.home).catch(() => undefined);
      return recreated
        ? `home ${this.home} was replaced by another directory`
        : `home ${this.home} was deleted`;
    }
    let info;
    try {
      info = await stat(this.home);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      return code === "ENOENT" ? `home ${this.home} was deleted` : `home ${this.home} cannot be read`;
    }
    if (info.dev !== this.identity.dev || info.ino !== this.identity.ino)
      return `home ${this.home} was replaced by another directory`;
    // Bounded and never blocking (a FIFO put there would hold every later check).
    const id = await readBoundedFile(join(this.home, HOME_ID_FILE), HOME_ID_MAX_BYTES).catch(
      (error: unknown) => ((error as NodeJS.ErrnoException).code === "ENOENT" ? undefined : ""),
    );
    if (id === undefined) return `the home identity ${HOME_ID_FILE} was deleted`;
    if (id.trim() !== this.homeId) return `the home identity ${HOME_ID_FILE} was replaced`;
    return undefined;
  }

  /** Stops the timer and lets go of the home. */
  stop(): void {
    // Stryker disable next-line ConditionalExpression: clearInterval(undefined) does nothing, as the guard does.
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    void this.held.close().catch(() => undefined);
  }
}
