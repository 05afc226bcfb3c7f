import { describe, expect, it } from "vitest";
import { IMAGE_PULL_TIMEOUT_MS, LAST_LOG_LINES } from "./runner-context.js";

describe("the lifecycle's fixed bounds (dstack-shim's)", () => {
  it("an image pull may take 20 minutes (ImagePullTimeout); a failed task's message keeps 5 log lines", () => {
    expect(IMAGE_PULL_TIMEOUT_MS).toBe(20 * 60_000);
    expect(LAST_LOG_LINES).toBe(5);
  });
});
