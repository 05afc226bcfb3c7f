/* Engines' GET /version answers, as captured on this kind of host (Debian 12). */

/** Debian 12's Podman 4.3.1 (`podman system service`), its GET /version answer as captured. */
export const PODMAN_4_3_1_VERSION = {
  Platform: { Name: "linux/amd64/debian-12" },
  Components: [
    {
      Name: "Podman Engine",
      Version: "4.3.1",
      Details: { APIVersion: "4.3.1", MinAPIVersion: "4.0.0", Os: "linux" },
    },
    { Name: "Conmon", Version: "conmon version 2.1.6, commit: unknown" },
    { Name: "OCI Runtime (runc)", Version: "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1" },
  ],
  Version: "4.3.1",
  ApiVersion: "1.41",
  MinAPIVersion: "1.24",
  Os: "linux",
};

/** Debian 12's Docker 20.10.24, its GET /version answer as captured. */
export const DOCKER_20_10_VERSION = {
  Platform: { Name: "" },
  Components: [
    { Name: "Engine", Version: "20.10.24+dfsg1", Details: { ApiVersion: "1.41", MinAPIVersion: "1.12" } },
    { Name: "containerd", Version: "1.6.20~ds1" },
    { Name: "runc", Version: "1.1.5+ds1" },
    { Name: "docker-init", Version: "0.19.0" },
  ],
  Version: "20.10.24+dfsg1",
  ApiVersion: "1.41",
  MinAPIVersion: "1.12",
};
