// S3 (path-style), with timeouts on every call.
import { S3Client, PutObjectCommand, GetObjectCommand, DeleteObjectCommand, ListObjectsV2Command } from "@aws-sdk/client-s3";
import { Config } from "./config";

export class Store {
  private client: S3Client;
  constructor(private cfg: Config) {
    // Credentials: the standard AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY variables.
    this.client = new S3Client({
      endpoint: cfg.s3Endpoint,
      region: process.env.AWS_REGION || "us-east-1",
      forcePathStyle: true,
      maxAttempts: 2,
      requestHandler: { requestTimeout: Math.max(cfg.ioTimeoutMs, 1000) * 2, connectionTimeout: cfg.ioTimeoutMs },
    });
  }

  async put(key: string, body: Buffer, contentType: string): Promise<void> {
    await this.client.send(new PutObjectCommand({ Bucket: this.cfg.s3Bucket, Key: key, Body: body, ContentType: contentType }));
  }

  async get(key: string): Promise<Buffer> {
    const out = await this.client.send(new GetObjectCommand({ Bucket: this.cfg.s3Bucket, Key: key }));
    const bytes = await out.Body!.transformToByteArray();
    return Buffer.from(bytes);
  }

  async del(key: string): Promise<void> {
    await this.client.send(new DeleteObjectCommand({ Bucket: this.cfg.s3Bucket, Key: key }));
  }

  async list(prefix: string): Promise<{ key: string; modified: Date }[]> {
    const out: { key: string; modified: Date }[] = [];
    let token: string | undefined;
    do {
      const page = await this.client.send(new ListObjectsV2Command({
        Bucket: this.cfg.s3Bucket, Prefix: prefix, ContinuationToken: token,
      }));
      for (const o of page.Contents || []) {
        if (o.Key && o.LastModified) out.push({ key: o.Key, modified: o.LastModified });
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
    return out;
  }
}
