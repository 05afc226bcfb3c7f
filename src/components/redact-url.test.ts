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

  it("returns a URL without secrets exactly as written, not as the URL parser would normalise it", () => {
    expect(redactUrl("HTTP://Example.COM/a/../b")).toBe("HTTP://Example.COM/a/../b");
  });

  it("redacts each secret on its own: a user, a password, a query string or a fragment alone", () => {
    expect(redactUrl("https://bob@host/f")).toBe("https://host/f");
    expect(redactUrl("https://:pw@host/f")).toBe("https://host/f");
    expect(redactUrl("https://host/f?sig=1")).toBe("https://host/f");
    expect(redactUrl("https://host/f#token")).toBe("https://host/f");
  });

  it("redacts a URL the parser refuses by its text: the userinfo up to the @, then from ? or #", () => {
    expect(redactUrl("http://bob:pw@[bad/p?sig=1#f")).toBe("http://[bad/p");
    expect(redactUrl("http://[bad/p#frag")).toBe("http://[bad/p");
    expect(redactUrl("http://[bad/p and more")).toBe("http://[bad/p and more");
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
