//! gRPC reflection on the gRPC port: the descriptors it serves, and a reflection
//! client (tonic-reflection's) listing and describing the services over one
//! bidirectional stream that stays open.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use prost::Message;
use prost_types::{FileDescriptorProto, FileDescriptorSet};
use tonic::transport::Channel;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1alpha;

const POLICY: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const ROOT: &str = "envoy/service/ratelimit/v3/rls.proto";
/// The Rate Limit Quota Service's file, served beside `ROOT`.
const RLQS: &str = "envoy/service/rate_limit_quota/v3/rlqs.proto";
/// Files whose comments `grpcurl describe` shows; the others' are left out.
const DOCUMENTED: [&str; 3] = [
    ROOT,
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    RLQS,
];

fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/service/ratelimit.binpb")
}

/// The host's target triple, from `rustc -vV`.
fn host() -> String {
    let out = std::process::Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// envoy-types' own descriptor set of every proto it compiles.
fn envoy_types_descriptors() -> Vec<u8> {
    std::fs::read(envoy_types_dir().join("src/generated/types.bin"))
        .expect("envoy-types ships types.bin")
}

/// Where cargo unpacked envoy-types (a dependency of the load generator), which
/// ships Envoy's protos and their compiled descriptors.
fn envoy_types_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Offline, and for this host only: a fresh machine has downloaded the packages
    // its build needs, not other platforms' (cargo metadata would want those too).
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let manifest = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types among the packages");
    Path::new(manifest).parent().unwrap().to_path_buf()
}

/// The `.proto` files under `dir`, as paths relative to it.
fn protos(dir: &Path, under: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(under).expect("read proto dir") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            protos(dir, &path, found);
        } else if path.extension().is_some_and(|e| e == "proto") {
            found.push(path.strip_prefix(dir).unwrap().to_path_buf());
        }
    }
}

#[test]
fn the_compiled_envoy_protos_are_envoy_types_own() {
    // build.rs compiles these copies; each must be the file envoy-types ships.
    let vendored = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/third_party");
    let mut files = Vec::new();
    protos(&vendored, &vendored, &mut files);
    assert!(files.len() > 20, "the vendored protos: {files:?}");
    let upstream = envoy_types_dir().join("proto");
    let roots = [
        "data-plane-api",
        "googleapis",
        "protoc-gen-validate",
        "xds",
        "ratelimit/api",
    ];
    for file in files {
        let theirs = roots
            .iter()
            .map(|r| upstream.join(r).join(&file))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{} is not among envoy-types' protos", file.display()));
        assert!(
            std::fs::read(vendored.join(&file)).unwrap() == std::fs::read(&theirs).unwrap(),
            "proto/third_party/{} differs from {}: copy it again",
            file.display(),
            theirs.display()
        );
    }
}

/// One field of an encoded message: its number, its whole encoding (key included)
/// and, for a length-delimited field, its payload.
struct Field<'a> {
    number: u64,
    whole: &'a [u8],
    payload: &'a [u8],
}

fn varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = b[*at];
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            break;
        }
    }
    v
}

/// The fields of an encoded message, read without decoding them, so that options
/// prost has no type for (validate rules, udpa annotations) are kept byte for byte.
fn fields(b: &[u8]) -> Vec<Field<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let start = at;
        let key = varint(b, &mut at);
        let mut payload = &b[at..at];
        match key & 7 {
            0 => {
                varint(b, &mut at);
            }
            1 => at += 8,
            2 => {
                let len = varint(b, &mut at) as usize;
                payload = &b[at..at + len];
                at += len;
            }
            5 => at += 4,
            w => panic!("wire type {w} in a descriptor"),
        }
        out.push(Field {
            number: key >> 3,
            whole: &b[start..at],
            payload,
        });
    }
    out
}

/// The set the port serves: `ROOT`, `RLQS` and everything they import, each file after its
/// imports, comments (`source_code_info`, field 9) kept only for `DOCUMENTED`.
fn ratelimit_descriptors(all: &[u8]) -> Vec<u8> {
    // FileDescriptorSet.file is field 1; FileDescriptorProto.name 1, dependency 3.
    let files: Vec<(String, Vec<String>, &[u8])> = fields(all)
        .into_iter()
        .filter(|f| f.number == 1)
        .map(|f| {
            let inner = fields(f.payload);
            let text = |n| {
                inner
                    .iter()
                    .filter(move |g| g.number == n)
                    .map(|g| String::from_utf8(g.payload.to_vec()).unwrap())
            };
            let name = text(1).next().expect("a file has a name");
            (name, text(3).collect(), f.payload)
        })
        .collect();
    fn visit<'a>(
        name: &str,
        files: &'a [(String, Vec<String>, &'a [u8])],
        out: &mut Vec<&'a (String, Vec<String>, &'a [u8])>,
    ) {
        if out.iter().any(|f| f.0 == name) {
            return;
        }
        let file = files
            .iter()
            .find(|f| f.0 == name)
            .unwrap_or_else(|| panic!("{name} in envoy-types' set"));
        for dep in &file.1 {
            visit(dep, files, out);
        }
        out.push(file);
    }
    let mut closure = Vec::new();
    visit(ROOT, &files, &mut closure);
    visit(RLQS, &files, &mut closure);
    let mut set = Vec::new();
    for (name, _, bytes) in closure {
        let mut file = Vec::new();
        for f in fields(bytes) {
            if f.number != 9 || DOCUMENTED.contains(&name.as_str()) {
                file.extend_from_slice(f.whole);
            }
        }
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut set);
        prost::encoding::encode_varint(file.len() as u64, &mut set);
        set.extend_from_slice(&file);
    }
    // What tonic-reflection and grpcurl read must decode as descriptors.
    let decoded = FileDescriptorSet::decode(&set[..]).expect("the set decodes");
    assert_eq!(
        decoded.file.last().map(FileDescriptorProto::name),
        Some(RLQS)
    );
    set
}

#[test]
fn the_served_descriptors_are_envoy_types_own() {
    let want = ratelimit_descriptors(&envoy_types_descriptors());
    let path = committed();
    if std::env::var_os("SLUICE_WRITE_DESCRIPTORS").is_some() {
        std::fs::write(&path, &want).expect("write descriptors");
    }
    let have = std::fs::read(&path).expect("committed descriptors");
    assert!(
        have == want,
        "{} differs from envoy-types' descriptors: regenerate it with \
         `SLUICE_WRITE_DESCRIPTORS=1 cargo test --test integration reflection::`",
        path.display()
    );
    assert_eq!(have, sluice::service::reflection::RATELIMIT_DESCRIPTORS);
}

async fn channel(server: &Server) -> Channel {
    Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

fn ask(request: MessageRequest) -> ServerReflectionRequest {
    ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    }
}

/// The first file of a FileDescriptorResponse.
fn first_file(r: MessageResponse) -> FileDescriptorProto {
    match r {
        MessageResponse::FileDescriptorResponse(f) => {
            FileDescriptorProto::decode(&f.file_descriptor_proto[0][..]).expect("a descriptor")
        }
        other => panic!("not a file: {other:?}"),
    }
}

const SERVICES: [&str; 5] = [
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    "envoy.service.ratelimit.v3.RateLimitService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Sends one question on the open stream and waits for its answer.
async fn next(
    tx: &mut futures::channel::mpsc::Sender<ServerReflectionRequest>,
    answers: &mut tonic::Streaming<tonic_reflection::pb::v1::ServerReflectionResponse>,
    request: MessageRequest,
) -> Result<MessageResponse, tonic::Status> {
    use futures::SinkExt;
    tx.send(ask(request)).await.expect("queued");
    let answer = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("answered while the request stream is open")?;
    Ok(answer
        .expect("an answer, not the end")
        .message_response
        .expect("a response"))
}

/// Every question of one conversation is answered while the client's side of the
/// stream stays open, as `grpcurl` keeps it.
#[tokio::test]
async fn reflection_answers_on_a_stream_that_stays_open() {
    let server = Server::start(POLICY, &[]);
    let mut client = ServerReflectionClient::new(channel(&server).await);
    let (mut tx, rx) = futures::channel::mpsc::channel(4);
    let mut answers =
        tokio::time::timeout(Duration::from_secs(10), client.server_reflection_info(rx))
            .await
            .expect("the stream opens at once")
            .expect("reflection is served")
            .into_inner();
    let listed = next(
        &mut tx,
        &mut answers,
        MessageRequest::ListServices(String::new()),
    )
    .await
    .unwrap();
    let mut names: Vec<String> = match listed {
        MessageResponse::ListServicesResponse(l) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("not a list: {other:?}"),
    };
    names.sort();
    assert_eq!(names, SERVICES);

    let rls = next(
        &mut tx,
        &mut answers,
        MessageRequest::FileContainingSymbol(SERVICES[1].into()),
    )
    .await
    .unwrap();
    let file = first_file(rls);
    assert_eq!(file.name(), ROOT);
    let service = &file.service[0];
    assert_eq!(service.name(), "RateLimitService");
    assert_eq!(service.method[0].name(), "ShouldRateLimit");
    assert_eq!(
        service.method[0].input_type(),
        ".envoy.service.ratelimit.v3.RateLimitRequest"
    );
    // Its imports are there too, by name, as a client resolving them asks.
    for dep in &file.dependency {
        let r = next(
            &mut tx,
            &mut answers,
            MessageRequest::FileByFilename(dep.clone()),
        )
        .await
        .unwrap();
        assert_eq!(&first_file(r).name(), dep);
    }
    let health = next(
        &mut tx,
        &mut answers,
        MessageRequest::FileContainingSymbol("grpc.health.v1.HealthCheckRequest".into()),
    )
    .await
    .unwrap();
    assert_eq!(first_file(health).package(), "grpc.health.v1");
    // An unknown symbol ends the conversation with NOT_FOUND.
    let err = next(
        &mut tx,
        &mut answers,
        MessageRequest::FileContainingSymbol("no.such.Thing".into()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
}

#[tokio::test]
async fn reflection_v1alpha_lists_the_same_services() {
    use v1alpha::server_reflection_client::ServerReflectionClient as Client;
    use v1alpha::server_reflection_request::MessageRequest as Request;
    use v1alpha::server_reflection_response::MessageResponse as Response;
    let server = Server::start(POLICY, &[]);
    let mut client = Client::new(channel(&server).await);
    let ask = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(Request::ListServices(String::new())),
    };
    // This client ends its side after one question: the answer still comes.
    let mut answers = client
        .server_reflection_info(futures::stream::iter([ask]))
        .await
        .unwrap()
        .into_inner();
    let listed = answers.message().await.unwrap().unwrap();
    let mut names: Vec<String> = match listed.message_response.unwrap() {
        Response::ListServicesResponse(l) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("not a list: {other:?}"),
    };
    names.sort();
    assert_eq!(names, SERVICES);
    assert!(
        answers.message().await.unwrap().is_none(),
        "then the stream ends, OK"
    );
}
