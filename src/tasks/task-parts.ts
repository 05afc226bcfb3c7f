/*
 * Values of a task that the domain owns and the adapters fill in: the engine reports ports and
 * pull progress, the host mounts volumes. They live here so that `tasks/` depends on nothing;
 * `docker/` and `host/` import them from here.
 */

/** A host port bound to a container port (bridge mode, 127.0.0.1 only). */
export interface PortMapping {
  readonly host: number;
  readonly container: number;
}

/**
 * Aggregate image pull progress, as reported in `TaskInfo.image_pull_progress`.
 * The keys are the wire keys of dstack-shim's `ImagePullProgress`.
 */
export interface ImagePullProgress {
  downloaded_bytes: number;
  extracted_bytes: number;
  total_bytes: number;
  /** False while some layer's size is still unknown, so `total_bytes` may still grow. */
  is_total_bytes_final: boolean;
}

/** A network volume to attach and mount on the host (`TaskConfig.volumes`). */
export interface VolumeInfo {
  readonly backend: string;
  readonly name: string;
  readonly volume_id: string;
  readonly init_fs: boolean;
  readonly device_name?: string | null;
}
