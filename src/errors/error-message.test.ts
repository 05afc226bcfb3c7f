import { describe, expect, it } from "vitest";
import { errorMessage } from "./error-message.js";

describe("errorMessage", () => {
  it("returns an Error's message unchanged, subclasses included", () => {
    expect(errorMessage(new Error("disk full"))).toBe("disk full");
    expect(errorMessage(new TypeError("not a function"))).toBe("not a function");
    expect(errorMessage(new Error(""))).toBe("");
  });

  it("takes the string message of an error-like object", () => {
    expect(errorMessage({ message: "from another realm", code: "EIO" })).toBe("from another realm");
  });

  it("returns a thrown string as it is", () => {
    expect(errorMessage("plain string")).toBe("plain string");
  });

  it("renders other throwables with String()", () => {
    expect(errorMessage(42)).toBe("42");
    expect(errorMessage(undefined)).toBe("undefined");
    expect(errorMessage(null)).toBe("null");
    expect(errorMessage({ message: 7 })).toBe("[object Object]");
    expect(errorMessage(Symbol("s"))).toBe("Symbol(s)");
  });

  it("never throws, even for a value String() cannot render", () => {
    expect(errorMessage(Object.create(null))).toBe("unknown error");
    const hostile = {
      toString(): string {
        throw new Error("no");
      },
    };
    expect(errorMessage(hostile)).toBe("unknown error");
  });
});
