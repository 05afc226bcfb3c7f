/**
 * URLs as they may appear in logs and error messages: without userinfo (`user:password@`), query
 * string (presigned signatures, tokens) or fragment. Download URLs of components carry exactly
 * these secrets.
 */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.username === "" && parsed.password === "" && parsed.search === "" && parsed.hash === "")
      return url;
    parsed.username = "";
    parsed.password = "";
    parsed.search = "";
    parsed.hash = "";
    return parsed.toString();
  } catch {
    return url.replace(/\/\/[^/@\s]*@/, "//").replace(/[?#].*$/, "");
  }
}

const URL_IN_TEXT = /\b[a-z][a-z0-9+.-]*:\/\/[^\s"'<>`]+/gi;

/** Every URL inside a text, redacted as {@link redactUrl} does. */
export function redactUrlsIn(text: string): string {
  return text.replace(URL_IN_TEXT, (match) => redactUrl(match));
}
