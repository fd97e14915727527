//! Certificates for the TLS tests, made with the `openssl` command: a CA, server
//! certificates for `localhost` and 127.0.0.1, client certificates, and a
//! Kubernetes-style Secret volume (`..data` symlink) to rotate them in.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::Server;

/// A certificate authority in a directory of its own.
pub struct Ca {
    pub dir: tempfile::TempDir,
    serial: std::cell::Cell<u32>,
}

/// The names of the certificates but [`Ca::client_for`]'s.
const LOCALHOST: &str = "DNS:localhost,IP:127.0.0.1";

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Ca {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> Ca {
        let dir = tempfile::tempdir().expect("tempdir");
        openssl(
            dir.path(),
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        Ca {
            dir,
            serial: std::cell::Cell::new(0),
        }
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A server certificate for localhost and 127.0.0.1 (EC P-256).
    pub fn server(&self) -> Pair {
        self.issue("localhost", "serverAuth", false, LOCALHOST)
    }

    /// A client certificate named `name`.
    pub fn client(&self, name: &str) -> Pair {
        self.issue(name, "clientAuth", false, LOCALHOST)
    }

    /// A client certificate whose one subject alternative name is the DNS name `dns`.
    pub fn client_for(&self, dns: &str) -> Pair {
        self.issue(dns, "clientAuth", false, &format!("DNS:{dns}"))
    }

    /// A server certificate for localhost and 127.0.0.1 valid from `not_before` to
    /// `not_after` (`YYMMDDHHMMSSZ` up to 2049, `YYYYMMDDHHMMSSZ` after), signed with
    /// `openssl ca`, the one command of OpenSSL 3.0 that sets both dates.
    pub fn server_dated(&self, not_before: &str, not_after: &str) -> Pair {
        let Csr {
            n,
            key,
            csr,
            cert,
            ext,
        } = self.csr("localhost", "serverAuth", false, LOCALHOST);
        let d = self.dir.path();
        let db = format!("{n}.db");
        std::fs::write(d.join(&db), "").expect("write the CA database");
        std::fs::write(d.join(format!("{n}.serial")), format!("{n:02X}\n"))
            .expect("write the serial");
        std::fs::write(
            d.join(format!("{n}.ca.cnf")),
            format!(
                "[ca]\ndefault_ca=d\n[d]\ndatabase={db}\nserial={n}.serial\nnew_certs_dir=.\n\
                 default_md=sha256\npolicy=p\nunique_subject=no\n[p]\ncommonName=supplied\n"
            ),
        )
        .expect("write the CA configuration");
        openssl(
            d,
            &[
                "ca",
                "-batch",
                "-notext",
                "-config",
                &format!("{n}.ca.cnf"),
                "-cert",
                "ca.crt",
                "-keyfile",
                "ca.key",
                "-in",
                &csr,
                "-out",
                &cert,
                "-extfile",
                &ext,
                "-startdate",
                not_before,
                "-enddate",
                not_after,
            ],
        );
        Pair {
            cert: d.join(cert),
            key: d.join(key),
        }
    }

    /// As Envoy Gateway makes them: RSA 2048 with a PKCS#1 key, for both uses.
    pub fn rsa_pkcs1(&self) -> Pair {
        self.issue("localhost", "serverAuth,clientAuth", true, LOCALHOST)
    }

    /// A new key (RSA 2048 with a PKCS#1 key, else P-256) and its signing request for
    /// `cn`, and the extensions for `usage` and the names `san`, in the CA's directory
    /// under the next serial.
    fn csr(&self, cn: &str, usage: &str, rsa: bool, san: &str) -> Csr {
        let n = self.serial.get() + 1;
        self.serial.set(n);
        let d = self.dir.path();
        let (key, csr, cert, ext) = (
            format!("{n}.key"),
            format!("{n}.csr"),
            format!("{n}.crt"),
            format!("{n}.cnf"),
        );
        if rsa {
            openssl(d, &["genrsa", "-traditional", "-out", &key, "2048"]);
            openssl(
                d,
                &[
                    "req",
                    "-new",
                    "-key",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={cn}"),
                ],
            );
        } else {
            openssl(
                d,
                &[
                    "req",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={cn}"),
                ],
            );
        }
        std::fs::write(
            d.join(&ext),
            format!("subjectAltName={san}\nextendedKeyUsage={usage}\n"),
        )
        .expect("write extensions");
        Csr {
            n,
            key,
            csr,
            cert,
            ext,
        }
    }

    fn issue(&self, cn: &str, usage: &str, rsa: bool, san: &str) -> Pair {
        let Csr {
            n,
            key,
            csr,
            cert,
            ext,
        } = self.csr(cn, usage, rsa, san);
        let d = self.dir.path();
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &n.to_string(),
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
        Pair {
            cert: d.join(cert),
            key: d.join(key),
        }
    }
}

/// The files of one certificate to sign: its serial, key, request, certificate to
/// be, and extensions.
struct Csr {
    n: u32,
    key: String,
    csr: String,
    cert: String,
    ext: String,
}

/// A mounted Secret as the kubelet writes it: `NAME -> ..data/NAME`, and `..data` a
/// symlink to a timestamped directory, swapped atomically on each update.
pub struct SecretVolume {
    pub dir: tempfile::TempDir,
    version: std::cell::Cell<u32>,
}

impl SecretVolume {
    /// A volume holding `tls.crt`, `tls.key` and, when given, `ca.crt`.
    pub fn new(pair: &Pair, ca: Option<&Path>) -> SecretVolume {
        let v = SecretVolume {
            dir: tempfile::tempdir().expect("tempdir"),
            version: std::cell::Cell::new(0),
        };
        v.update(pair, ca);
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), v.dir.path().join(name))
                .expect("symlink");
        }
        v
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a new version and swaps `..data` to it in one rename.
    pub fn update(&self, pair: &Pair, ca: Option<&Path>) {
        let n = self.version.get() + 1;
        self.version.set(n);
        let d = self.dir.path();
        let version = d.join(format!("..v{n}"));
        std::fs::create_dir(&version).expect("version dir");
        std::fs::copy(&pair.cert, version.join("tls.crt")).expect("copy cert");
        std::fs::copy(&pair.key, version.join("tls.key")).expect("copy key");
        if let Some(ca) = ca {
            std::fs::copy(ca, version.join("ca.crt")).expect("copy ca");
        }
        let tmp = d.join("..data_tmp");
        std::os::unix::fs::symlink(format!("..v{n}"), &tmp).expect("symlink");
        std::fs::rename(&tmp, d.join("..data")).expect("swap ..data");
    }
}

/// The flags that serve `port` (`grpc`, `http`, `admin`) over TLS with `cert` and
/// `key`.
pub fn tls_flags(port: &str, cert: &Path, key: &Path) -> Vec<String> {
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    vec![
        format!("--{port}-tls-cert"),
        path(cert),
        format!("--{port}-tls-key"),
        path(key),
    ]
}

/// As [`tls_flags`] with `pair`, taking only clients with a certificate `client_ca`
/// signed (mutual TLS).
pub fn mutual_tls_flags(port: &str, pair: &Pair, client_ca: &Path) -> Vec<String> {
    let mut flags = tls_flags(port, &pair.cert, &pair.key);
    flags.push(format!("--{port}-tls-client-ca"));
    flags.push(client_ca.to_str().expect("a UTF-8 path").to_string());
    flags
}

/// A sluice on `policy` whose admin API takes only clients with a certificate of
/// `ca`, and presents one of its own from `ca`.
pub fn admin_over_mutual_tls(policy: &str, ca: &Ca) -> Server {
    let flags = mutual_tls_flags("admin", &ca.server(), &ca.cert());
    Server::start(
        policy,
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    )
}

/// The DER of the first certificate in a PEM file.
pub fn der(pem: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(pem)
        .expect("a PEM certificate")
        .to_vec()
}

/// A rustls client that trusts `ca` and, when given, presents `identity`.
pub fn client_config(ca: &Path, identity: Option<&Pair>, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).expect("CA"))
        .expect("add CA");
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(p) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(&p.cert)
                    .expect("cert")
                    .collect::<Result<Vec<_>, _>>()
                    .expect("certs"),
                PrivateKeyDer::from_pem_file(&p.key).expect("key"),
            )
            .expect("client identity"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// A TLS connection to `addr` (server name `localhost`).
pub async fn connect(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// The certificate `addr` presents to a new connection.
pub async fn served(addr: &str, config: Arc<rustls::ClientConfig>) -> std::io::Result<Vec<u8>> {
    let tls = connect(addr, config).await?;
    let (_, session) = tls.get_ref();
    Ok(session
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default())
}
