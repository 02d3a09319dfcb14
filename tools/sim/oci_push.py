#!/usr/bin/python3
"""Builds a one-layer OCI image and pushes it to a registry over HTTPS (distribution API v2:
monolithic blob uploads, then the manifest, optionally wrapped in an image index).

The layer is a tar of a directory (--dir), of a generated Triton kernel cache (--triton, with
real-shaped metadata per architecture), optionally with one large file of random bytes
(--random-bytes, for benchmarks), or hostile entries (--evil). Bad-input switches make the
manifest lie (--lie-size). Prints one JSON line: {"manifest", "index", "layer", "layerSize",
"config"}.

  oci_push.py --registry 127.0.0.1:5000 --cacert ca.pem --repo caches/demo --tag v1 --triton 80,90
"""

import argparse
import gzip
import hashlib
import http.client
import io
import json
import os
import ssl
import sys
import tarfile
import tempfile
import urllib.parse

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def triton_cache(root, archs, ptx):
    """A few files shaped like ~/.triton/cache/<hash>/: metadata JSON, binaries, a group file."""
    for arch in archs:
        key = hashlib.sha256(("add_kernel-%s" % arch).encode()).hexdigest()[:52]
        d = os.path.join(root, key)
        os.makedirs(d, exist_ok=True)
        meta = {
            "hash": hashlib.sha256(("h%s" % arch).encode()).hexdigest(),
            "target": {"backend": "cuda", "arch": int(arch), "warp_size": 32},
            "num_warps": 4, "num_ctas": 1, "num_stages": 3, "maxnreg": None, "cluster_dims": [1, 1, 1],
            "ptx_version": ptx, "enable_fp_fusion": True, "launch_cooperative_grid": False,
            "supported_fp8_dtypes": ["fp8e4b15", "fp8e5"], "deprecated_fp8_dtypes": [],
            "default_dot_input_precision": "tf32", "allowed_dot_input_precisions": ["tf32", "tf32x3", "ieee"],
            "max_num_imprecise_acc_default": 0, "extern_libs": [], "debug": False,
            "backend_name": "cuda", "sanitize_overflow": True, "arch": "sm%s" % arch,
            "triton_version": "3.2.0", "shared": 0, "global_scratch_size": 0, "global_scratch_align": 1,
            "name": "add_kernel",
        }
        with open(os.path.join(d, "add_kernel.json"), "w") as f:
            json.dump(meta, f)
        for ext, body in ((".cubin", b"\x7fELF" + os.urandom(2048)),
                          (".ptx", (".version %d.%d\n.target sm_%s\n" % (ptx // 10, ptx % 10, arch)).encode()),
                          (".ttir", b"module {}\n"), (".ttgir", b"module {}\n"), (".llir", b"; llvm\n")):
            with open(os.path.join(d, "add_kernel" + ext), "wb") as f:
                f.write(body)
        with open(os.path.join(d, "__grp__add_kernel.json"), "w") as f:
            json.dump({"child_paths": {"add_kernel.json": os.path.join(d, "add_kernel.json")}}, f)


def add_evil(tar, kind):
    data = b"escaped\n"
    if kind == "dotdot":
        info = tarfile.TarInfo("cache/../../evil.txt")
    elif kind == "abs":
        info = tarfile.TarInfo("/tmp/gkm-evil-absolute.txt")
    elif kind == "symlink":
        link = tarfile.TarInfo("cache/escape")
        link.type = tarfile.SYMTYPE
        link.linkname = "../../../etc"
        tar.addfile(link)
        return
    elif kind == "hardlink":
        link = tarfile.TarInfo("cache/hard")
        link.type = tarfile.LNKTYPE
        link.linkname = "../outside"
        tar.addfile(link)
        return
    else:
        raise SystemExit("unknown --evil " + kind)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def build_layer(args, out):
    """Writes the layer tar (gzip with --gzip) to the file object `out`."""
    raw = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) if args.gzip else out
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        with tempfile.TemporaryDirectory() as tmp:
            src = args.dir
            if args.triton:
                src = os.path.join(tmp, "cache")
                triton_cache(src, args.triton.split(","), args.ptx)
            if src:
                for name in sorted(os.listdir(src)):
                    tar.add(os.path.join(src, name), arcname=name)
            if args.random_bytes:
                info = tarfile.TarInfo("blob/random.bin")
                info.size = args.random_bytes

                class Random(io.RawIOBase):
                    def readable(self):
                        return True

                    def readinto(self, b):
                        n = len(b)
                        b[:n] = os.urandom(n)
                        return n

                tar.addfile(info, io.BufferedReader(Random(), 1 << 20))
        if args.evil:
            add_evil(tar, args.evil)
    if args.gzip:
        raw.close()


class Registry:
    def __init__(self, host, cacert):
        self.host = host
        self.ctx = ssl.create_default_context(cafile=cacert)

    def conn(self):
        return http.client.HTTPSConnection(self.host, context=self.ctx, timeout=120)

    def push_blob(self, repo, path_or_bytes):
        h = hashlib.sha256()
        if isinstance(path_or_bytes, bytes):
            h.update(path_or_bytes)
            size = len(path_or_bytes)
        else:
            size = os.path.getsize(path_or_bytes)
            with open(path_or_bytes, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        digest = "sha256:" + h.hexdigest()
        c = self.conn()
        c.request("POST", "/v2/%s/blobs/uploads/" % repo, headers={"Content-Length": "0"})
        r = c.getresponse()
        r.read()
        if r.status != 202:
            raise SystemExit("upload start: HTTP %d" % r.status)
        loc = urllib.parse.urlsplit(r.getheader("Location"))
        target = loc.path + "?" + (loc.query + "&" if loc.query else "") + "digest=" + urllib.parse.quote(digest)
        body = path_or_bytes if isinstance(path_or_bytes, bytes) else open(path_or_bytes, "rb")
        c = self.conn()
        c.request("PUT", target, body=body,
                  headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        r = c.getresponse()
        r.read()
        if r.status != 201:
            raise SystemExit("upload of %s: HTTP %d" % (digest, r.status))
        return digest, size

    def put_manifest(self, repo, ref, body, media_type):
        c = self.conn()
        c.request("PUT", "/v2/%s/manifests/%s" % (repo, ref), body=body, headers={"Content-Type": media_type})
        r = c.getresponse()
        text = r.read()
        if r.status != 201:
            raise SystemExit("manifest %s: HTTP %d %s" % (ref, r.status, text[:300]))
        return "sha256:" + hashlib.sha256(body).hexdigest()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--registry", required=True)
    p.add_argument("--cacert", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--tag", default="latest")
    p.add_argument("--dir")
    p.add_argument("--triton", help="comma-separated CUDA archs, e.g. 80,90")
    p.add_argument("--ptx", type=int, default=84, help="ptx_version in the metadata (84 = PTX ISA 8.4)")
    p.add_argument("--random-bytes", type=int, default=0)
    p.add_argument("--gzip", action="store_true")
    p.add_argument("--evil", choices=["dotdot", "abs", "symlink", "hardlink"])
    p.add_argument("--index", action="store_true", help="push an image index (arm64 first, then amd64)")
    p.add_argument("--lie-size", type=int, default=0, help="the manifest gives this size for the layer")
    args = p.parse_args()

    reg = Registry(args.registry, args.cacert)
    with tempfile.NamedTemporaryFile(suffix=".tar") as layer:
        build_layer(args, layer)
        layer.flush()
        layer_digest, layer_size = reg.push_blob(args.repo, layer.name)
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": {"cache.triton.image/variant": "triton"}},
        "rootfs": {"type": "layers", "diff_ids": []},
    }
    config_body = json.dumps(config, sort_keys=True).encode()
    config_digest, config_size = reg.push_blob(args.repo, config_body)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": LAYER_GZIP if args.gzip else LAYER_TAR, "digest": layer_digest,
                    "size": args.lie_size or layer_size}],
    }
    manifest_body = json.dumps(manifest, sort_keys=True).encode()
    out = {"layer": layer_digest, "layerSize": layer_size, "config": config_digest}
    if args.index:
        digest = reg.put_manifest(args.repo, "sha256:" + hashlib.sha256(manifest_body).hexdigest(), manifest_body,
                                  OCI_MANIFEST)
        other = dict(manifest)
        other["annotations"] = {"org.example.variant": "arm64"}
        other_body = json.dumps(other, sort_keys=True).encode()
        other_digest = reg.put_manifest(args.repo, "sha256:" + hashlib.sha256(other_body).hexdigest(), other_body,
                                        OCI_MANIFEST)
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": other_digest, "size": len(other_body),
             "platform": {"os": "linux", "architecture": "arm64"}},
            {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest_body),
             "platform": {"os": "linux", "architecture": "amd64"}}]}
        index_body = json.dumps(index, sort_keys=True).encode()
        out["index"] = reg.put_manifest(args.repo, args.tag, index_body, OCI_INDEX)
        out["manifest"] = digest
    else:
        out["manifest"] = reg.put_manifest(args.repo, args.tag, manifest_body, OCI_MANIFEST)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
