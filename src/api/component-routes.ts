import { ComponentInstallBody, Components } from "../wire/schemas.js";
import type { ApiDeps } from "./api-deps.js";
import type { ApiRoute } from "./openapi.js";
import { readBody, sendText } from "./replies.js";

/** The runner and shim binaries: `GET /api/components` and `POST /api/components/install`. */
export function componentRoutes(deps: ApiDeps): ApiRoute[] {
  return [
    {
      method: "GET",
      url: "/api/components",
      summary: "The runner and shim binaries: version and install status",
      response: Components,
      handler: async () => ({ components: await deps.components.list() }),
    },
    {
      method: "POST",
      url: "/api/components/install",
      summary: "Download and install a component in the background (409 while installing)",
      body: ComponentInstallBody,
      handler: (request, reply) => {
        const b = readBody(request, ComponentInstallBody);
        deps.components.install(b.name, b.url, b.sha256 ?? undefined);
        return sendText(reply, 200, "");
      },
    },
  ];
}
