// Image checks and renders with sharp (libvips). Type from magic bytes only; caps on pixels, sides and frames;
// every render has its own time limit: sharp's timeout (whole seconds, rounded up) counts the render's own
// processing in libvips, never the time it waited for a free thread.
import sharp from "sharp";

sharp.cache(false);

export const MAX_PIXELS = 40_000_000;
export const MAX_SIDE = 16384;
export const MAX_FRAMES = 300;

export function sniff(head: Buffer): string | null {
  if (head.length >= 3 && head[0] === 0xff && head[1] === 0xd8 && head[2] === 0xff) return "image/jpeg";
  if (head.length >= 8 && head.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))) return "image/png";
  if (head.length >= 6 && (head.subarray(0, 6).toString("latin1") === "GIF87a" || head.subarray(0, 6).toString("latin1") === "GIF89a")) return "image/gif";
  if (head.length >= 12 && head.subarray(0, 4).toString("latin1") === "RIFF" && head.subarray(8, 12).toString("latin1") === "WEBP") return "image/webp";
  return null;
}

export class ImageRejected extends Error {
  constructor(public code: string, message: string) {
    super(message);
  }
}

// A GIF's logical screen (bytes 6-9) may be far larger than its frames, and the decoder sizes its canvas from it.
function gifScreen(data: Buffer): { w: number; h: number } | null {
  if (data.length < 10 || data.subarray(0, 3).toString("latin1") !== "GIF") return null;
  return { w: data.readUInt16LE(6), h: data.readUInt16LE(8) };
}

function checkDims(w: number, h: number): void {
  if (w > MAX_SIDE || h > MAX_SIDE) throw new ImageRejected("image_too_large", `a side exceeds ${MAX_SIDE} px`);
  if (w * h > MAX_PIXELS) throw new ImageRejected("image_too_large", `more than ${MAX_PIXELS} pixels`);
}

// Header-only inspection at upload: refuses what the decoder would never be allowed to render.
export async function inspect(data: Buffer): Promise<void> {
  let meta: sharp.Metadata;
  try {
    meta = await sharp(data, { limitInputPixels: false, pages: 1 }).metadata();
  } catch (err) {
    throw new ImageRejected("undecodable", "the image header cannot be read");
  }
  const w = meta.width || 0;
  const h = meta.pageHeight || meta.height || 0;
  if (!w || !h) throw new ImageRejected("undecodable", "the image has no dimensions");
  checkDims(w, h);
  const screen = gifScreen(data);
  if (screen) checkDims(screen.w, screen.h);
  if ((meta.pages || 1) > MAX_FRAMES) throw new ImageRejected("too_many_frames", `more than ${MAX_FRAMES} frames`);
}

export interface Rendition {
  name: string;
  body: Buffer;
  contentType: string;
  ext: string;
  width: number;
  height: number;
}

export class RenderFailed extends Error {
  constructor(public code: string, message: string) {
    super(message);
  }
}

export async function render(name: string, data: Buffer, timeoutMs: number): Promise<Rendition> {
  const screen = gifScreen(data);
  if (screen && (screen.w > MAX_SIDE || screen.h > MAX_SIDE || screen.w * screen.h > MAX_PIXELS)) {
    throw new RenderFailed("image_too_large", "the GIF's logical screen exceeds the pixel cap");
  }
  const seconds = Math.max(1, Math.ceil(timeoutMs / 1000));
  let pipeline = sharp(data, { limitInputPixels: MAX_PIXELS, pages: 1, failOn: "none", sequentialRead: true })
    .rotate()
    .timeout({ seconds });
  let contentType: string;
  let ext: string;
  if (name === "thumbnail") {
    pipeline = pipeline.resize(160, 160, { fit: "inside" }).webp({ quality: 70 });
    contentType = "image/webp";
    ext = "webp";
  } else if (name === "crop") {
    pipeline = pipeline.resize(320, 320, { fit: "cover", position: "centre" }).jpeg({ quality: 80 });
    contentType = "image/jpeg";
    ext = "jpg";
  } else {
    pipeline = pipeline.resize(1280, 1280, { fit: "inside", withoutEnlargement: true }).webp({ quality: 80 });
    contentType = "image/webp";
    ext = "webp";
  }
  try {
    const { data: body, info } = await pipeline.toBuffer({ resolveWithObject: true });
    return { name, body, contentType, ext, width: info.width, height: info.height };
  } catch (err) {
    if (err instanceof RenderFailed) throw err;
    const msg = String((err as Error).message || err);
    if (/timeout/i.test(msg)) throw new RenderFailed("decode_timeout", `render of ${name} exceeded its time limit`);
    if (/pixel limit|exceeds limit/i.test(msg)) throw new RenderFailed("image_too_large", msg.slice(0, 200));
    throw new RenderFailed("undecodable", msg.slice(0, 200));
  }
}
