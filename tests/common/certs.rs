//! Certificates as Envoy Gateway's certgen makes them (`internal/crypto/certgen.go`):
//! one CA, RSA 2048 keys in PKCS#1 (`RSA PRIVATE KEY`), key usages but no extended
//! key usage; the xDS server's certificate names `envoy-gateway` (and `localhost`,
//! as on a host install), the rate limit service's has CN `*` and SAN
//! `*.envoy-gateway-system`. Written with the openssl command.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A CA and the certificates signed by it, in a directory.
pub struct Certs {
    pub dir: tempfile::TempDir,
}

impl Certs {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `ca.crt`; `envoy-gateway.{crt,key}` (xDS server); `tls.{crt,key}` (the rate
    /// limit service's, as the Secret `envoy-rate-limit` holds it); and
    /// `other-ca.crt` with `stranger.{crt,key}`, signed by another CA.
    pub fn envoy_gateway() -> Certs {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        ca(d, "ca", "envoy-gateway");
        leaf(
            d,
            "envoy-gateway",
            "ca",
            "envoy-gateway",
            "DNS:envoy-gateway,DNS:envoy-gateway.envoy-gateway-system,DNS:localhost",
        );
        leaf(
            d,
            "tls",
            "ca",
            "*",
            "DNS:*.envoy-gateway-system,DNS:localhost",
        );
        ca(d, "other-ca", "someone else");
        leaf(d, "stranger", "other-ca", "*", "DNS:localhost");
        Certs { dir }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "openssl {args:?} failed");
}

/// An RSA 2048 key in PKCS#1, as Go's `x509.MarshalPKCS1PrivateKey` writes it.
fn key(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "genrsa",
            "-traditional",
            "-out",
            &format!("{name}.key"),
            "2048",
        ],
    );
}

fn ca(dir: &Path, name: &str, cn: &str) {
    key(dir, name);
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=keyEncipherment,digitalSignature,keyCertSign",
        ],
    );
}

fn leaf(dir: &Path, name: &str, ca: &str, cn: &str, san: &str) {
    key(dir, name);
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!(
            "keyUsage=digitalSignature,dataEncipherment,keyEncipherment,nonRepudiation\nsubjectAltName={san}\n"
        ),
    )
    .expect("write extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}
