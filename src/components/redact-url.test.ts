import { describe, expect, it } from "vitest";
import { redactUrl, redactUrlsIn } from "./redact-url.js";

describe("redactUrl", () => {
  it("drops userinfo, query string and fragment, and leaves a plain URL alone", () => {
    expect(redactUrl("http://bob:HunterPW22@host:8080/a/b?X-Amz-Signature=abc#frag")).toBe(
      "http://host:8080/a/b",
    );
    expect(redactUrl("https://example.com/runner")).toBe("https://example.com/runner");
    expect(redactUrl("not a url?secret")).toBe("not a url");
  });

  it("redacts every URL inside a message", () => {
    expect(
      redactUrlsIn(
        'Request cannot be constructed from a URL that includes credentials: http://bob:HunterPW22@h/x?sig=1 and "https://a/b?token=t"',
      ),
    ).toBe(
      'Request cannot be constructed from a URL that includes credentials: http://h/x and "https://a/b"',
    );
  });
});
