//! What the `http` benchmark's connections send: the workloads, and each connection's next
//! request as raw HTTP/1.1 bytes over its own sessions.

use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::workload::scatter;

/// Sessions each connection creates before the clock starts, for reads and patches.
pub(crate) const SESSIONS_PER_CONNECTION: u64 = 16;

/// What each request does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `POST /v1/sessions` of a fresh session with a 150-byte will.
    Create,
    /// `GET /v1/sessions/{id}?consistency=...` of one of the connection's sessions.
    Get(String),
    /// `PATCH /v1/sessions/{id}` of `connection_id`.
    Patch,
    /// Per ten requests: five linearizable reads, three patches, two creates.
    Mixed,
    /// `POST /v1/sessions/batch` of this many creates.
    Batch(u64),
    /// `GET /livez`: the HTTP stack and the server's one layer alone, no engine (the floor
    /// under every other workload's cost).
    Livez,
    /// The soak's mix, per ten requests: four linearizable and one stale read, two patches,
    /// a create of a session that lives on, a create of a session that expires 5 s later
    /// (connection 0: the server's expiry scan removes it), and a delete of the one created
    /// before it.
    Soak,
    /// `POST /v1/plugins/{name}/commands?key=...` of the kv plugin's put of a 150-byte value
    /// under a fresh key, as raw bytes: a plugin served beside the sessions
    /// (`concord serve --plugin {name}=fixtures/plugins/kv.wasm`).
    KvPut(String),
    /// `POST /v1/plugins/{name}/commands/batch` of this many `kv-put` commands, each under a
    /// fresh key.
    KvBatch(String, u64),
}

/// The value each `kv-put` command stores.
const KV_VALUE_BYTES: usize = 150;

/// A served plugin's name as the workloads take it.
fn is_plugin_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_".contains(c))
}

/// The kv plugin's put of a 150-byte value under `key` (ASCII, shorter than 128 bytes): op 1,
/// the key's length as u16 little-endian, the key, the value.
fn kv_put_command(key: &str) -> String {
    let key_len = u8::try_from(key.len())
        .ok()
        .filter(|len| *len < 0x80)
        .expect("a key shorter than 128 bytes");
    let mut command = String::with_capacity(3 + key.len() + KV_VALUE_BYTES);
    command.push('\u{1}');
    command.push(char::from(key_len));
    command.push('\0');
    command.push_str(key);
    command.extend(std::iter::repeat_n('v', KV_VALUE_BYTES));
    command
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(word: &str) -> Result<Workload, String> {
        let (name, argument) = word.split_once(':').unwrap_or((word, ""));
        match (name, argument) {
            ("create", "") => Ok(Workload::Create),
            ("get", "") => Ok(Workload::Get("linearizable".into())),
            ("get", consistency @ ("linearizable" | "lease" | "stale")) => {
                Ok(Workload::Get(consistency.into()))
            }
            ("patch", "") => Ok(Workload::Patch),
            ("mixed", "") => Ok(Workload::Mixed),
            ("livez", "") => Ok(Workload::Livez),
            ("soak", "") => Ok(Workload::Soak),
            ("kv-put", name) if is_plugin_name(name) => Ok(Workload::KvPut(name.into())),
            ("kv-batch", argument) => match argument.split_once(':') {
                Some((name, size)) if is_plugin_name(name) => match size.parse::<u64>() {
                    Ok(size) if (1..=10_000).contains(&size) => {
                        Ok(Workload::KvBatch(name.into(), size))
                    }
                    _ => Err(format!(
                        "kv-batch:<name>:<1..=10000 commands>, not {word:?}"
                    )),
                },
                _ => Err(format!(
                    "kv-batch:<name>:<1..=10000 commands>, not {word:?}"
                )),
            },
            ("batch", size) => match size.parse::<u64>() {
                Ok(size) if (1..=10_000).contains(&size) => Ok(Workload::Batch(size)),
                _ => Err(format!("batch:<1..=10000 operations>, not {word:?}")),
            },
            _ => Err(format!(
                "create, get[:linearizable|lease|stale], patch, mixed, batch:<n>, livez, soak, \
                 kv-put:<served plugin name> or kv-batch:<served plugin name>:<n>, not {word:?}"
            )),
        }
    }
}

impl Workload {
    /// The name in case names and reports: `create`, `get_lease`, `batch_100`...
    pub fn name(&self) -> String {
        match self {
            Workload::Create => "create".into(),
            Workload::Get(consistency) => format!("get_{consistency}"),
            Workload::Patch => "patch".into(),
            Workload::Mixed => "mixed".into(),
            Workload::Batch(size) => format!("batch_{size}"),
            Workload::Livez => "livez".into(),
            Workload::Soak => "soak".into(),
            Workload::KvPut(name) => format!("kv_put_{name}"),
            Workload::KvBatch(name, size) => format!("kv_batch_{name}_{size}"),
        }
    }

    /// Whether each connection makes sessions to read or patch before the clock starts.
    pub(crate) fn needs_sessions(&self) -> bool {
        matches!(
            self,
            Workload::Get(_) | Workload::Patch | Workload::Mixed | Workload::Soak
        )
    }
}

/// How the client ids of created sessions follow one another on a connection. Where a store
/// keeps keys sorted, this decides where its writes land: next to each other, or all over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientIds {
    /// `<connection's prefix>/<n>`, n counting from 1 in decimal: in sorted order a new id
    /// lands among the connection's earlier ones (`…/1240` just after `…/124`), near the
    /// ids made shortly before it.
    Counter,
    /// `<connection's prefix>/<16 hex digits>` from a generator seeded by the connection:
    /// device-like ids, each landing anywhere among the connection's earlier ones.
    Random,
}

impl ClientIds {
    /// The name `--client-ids` takes and the JSON lines record.
    pub fn name(self) -> &'static str {
        match self {
            ClientIds::Counter => "counter",
            ClientIds::Random => "random",
        }
    }
}

impl FromStr for ClientIds {
    type Err = String;

    fn from_str(word: &str) -> Result<ClientIds, String> {
        match word {
            "counter" => Ok(ClientIds::Counter),
            "random" => Ok(ClientIds::Random),
            _ => Err(format!("counter or random, not {word:?}")),
        }
    }
}

/// One connection's requests: what it sends next, from its own sessions.
pub(crate) struct Requests {
    /// The server's `host:port`.
    pub(crate) host: String,
    pub(crate) prefix: String,
    pub(crate) workload: Workload,
    pub(crate) sequence: u64,
    pub(crate) client_ids: ClientIds,
    /// The state of the generator of random client ids (seeded per connection).
    pub(crate) random_state: u64,
}

impl Requests {
    /// The next request, and how many operations it carries.
    pub(crate) fn next(&mut self) -> (String, u64) {
        self.sequence += 1;
        let n = self.sequence;
        match &self.workload {
            Workload::Create => {
                let client_id = self.new_client_id(n);
                (self.create(&client_id, n), 1)
            }
            Workload::Get(consistency) => (self.get(n, consistency), 1),
            Workload::Patch => (self.patch(n), 1),
            Workload::Mixed => match n % 10 {
                0..=4 => (self.get(n, "linearizable"), 1),
                5..=7 => (self.patch(n), 1),
                _ => {
                    let client_id = self.new_client_id(n);
                    (self.create(&client_id, n), 1)
                }
            },
            Workload::Batch(size) => {
                let operations: Vec<String> = (0..*size)
                    .map(|i| {
                        format!(
                            r#"{{"op":"create","client_id":"{}/{n}/{i}","session":{}}}"#,
                            self.prefix,
                            session_fields(&self.prefix, n)
                        )
                    })
                    .collect();
                let body = format!(r#"{{"operations":[{}]}}"#, operations.join(","));
                (self.post("/v1/sessions/batch", &body), *size)
            }
            Workload::Livez => (
                format!("GET /livez HTTP/1.1\r\nHost: {}\r\n\r\n", self.host),
                1,
            ),
            Workload::Soak => match n % 10 {
                0..=3 => (self.get(n, "linearizable"), 1),
                4 => (self.get(n, "stale"), 1),
                5 | 6 => (self.patch(n), 1),
                7 => (self.create(&format!("{}/{n}", self.prefix), n), 1),
                8 => (self.create_expiring(&format!("{}/x/{n}", self.prefix)), 1),
                _ => (self.delete(&format!("{}/{}", self.prefix, n - 2)), 1),
            },
            Workload::KvPut(name) => (self.kv_put(name, n), 1),
            Workload::KvBatch(name, size) => (self.kv_batch(name, n, *size), *size),
        }
    }

    /// The client id of the `n`th session this connection creates.
    fn new_client_id(&mut self, n: u64) -> String {
        match self.client_ids {
            ClientIds::Counter => format!("{}/{n}", self.prefix),
            ClientIds::Random => {
                // splitmix64: a step of the state, then its bijective finalizer, so distinct
                // steps give distinct ids.
                self.random_state = self.random_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                format!("{}/{:016x}", self.prefix, scatter(self.random_state))
            }
        }
    }

    /// The kv plugin's put (op 1, the key's length as u16 little-endian, the key, the value)
    /// as a raw command. Keys are ASCII and shorter than 128 bytes, so the request is text.
    fn kv_put(&self, plugin: &str, n: u64) -> String {
        let key = format!("{}/{n}", self.prefix);
        let command = kv_put_command(&key);
        format!(
            "POST /v1/plugins/{plugin}/commands?key={} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n{command}",
            key.replace('/', "%2F"),
            self.host,
            command.len()
        )
    }

    /// `size` kv puts under fresh keys in one request to the plugin's batch route.
    fn kv_batch(&self, plugin: &str, n: u64, size: u64) -> String {
        let commands: Vec<String> = (0..size)
            .map(|i| {
                let key = format!("{}/{n}/{i}", self.prefix);
                let command = BASE64.encode(kv_put_command(&key));
                format!(r#"{{"key":"{key}","command_base64":"{command}"}}"#)
            })
            .collect();
        let body = format!(r#"{{"commands":[{}]}}"#, commands.join(","));
        self.post(&format!("/v1/plugins/{plugin}/commands/batch"), &body)
    }

    /// A session that expires 5 s after it is made (no connection holds it).
    fn create_expiring(&self, client_id: &str) -> String {
        let body = format!(
            r#"{{"client_id":"{client_id}","session_expiry_interval_secs":5,"broker_id":"broker-1","connection_id":0}}"#
        );
        self.post("/v1/sessions", &body)
    }

    fn delete(&self, client_id: &str) -> String {
        format!(
            "DELETE /v1/sessions/{} HTTP/1.1\r\nHost: {}\r\n\r\n",
            client_id.replace('/', "%2F"),
            self.host
        )
    }

    /// The `i`-th of the sessions made before the clock started.
    fn existing(&self, n: u64) -> String {
        format!(
            "{}%2Fseed%2F{}",
            self.prefix.replace('/', "%2F"),
            n % SESSIONS_PER_CONNECTION
        )
    }

    pub(crate) fn create(&self, client_id: &str, n: u64) -> String {
        let fields = session_fields(&self.prefix, n);
        let body = format!(r#"{{"client_id":"{client_id}",{}"#, &fields[1..]);
        self.post("/v1/sessions", &body)
    }

    fn get(&self, n: u64, consistency: &str) -> String {
        format!(
            "GET /v1/sessions/{}?consistency={consistency} HTTP/1.1\r\nHost: {}\r\n\r\n",
            self.existing(n),
            self.host
        )
    }

    fn patch(&self, n: u64) -> String {
        let body = format!(r#"{{"connection_id":{n}}}"#);
        format!(
            "PATCH /v1/sessions/{} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.existing(n),
            self.host,
            body.len()
        )
    }

    fn post(&self, path: &str, body: &str) -> String {
        format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        )
    }
}

/// A session's fields as JSON: an hour's expiry, a broker, a connection and a 150-byte will.
fn session_fields(prefix: &str, n: u64) -> String {
    format!(
        r#"{{"session_expiry_interval_secs":3600,"broker_id":"broker-1","connection_id":{n},"last_will":{{"topic":"status/{prefix}","payload_base64":"b2ZmbGluZQ==","qos":1}}}}"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_and_build_requests() {
        assert_eq!("create".parse::<Workload>().unwrap(), Workload::Create);
        assert_eq!(
            "get:lease".parse::<Workload>().unwrap(),
            Workload::Get("lease".into())
        );
        assert_eq!("batch:50".parse::<Workload>().unwrap(), Workload::Batch(50));
        assert!("batch:0".parse::<Workload>().is_err());
        assert!("get:eventual".parse::<Workload>().is_err());
        assert_eq!("livez".parse::<Workload>().unwrap(), Workload::Livez);
        assert_eq!(
            "kv-put:kv".parse::<Workload>().unwrap(),
            Workload::KvPut("kv".into())
        );
        assert!("kv-put:".parse::<Workload>().is_err());
        assert_eq!(
            "kv-batch:kv:50".parse::<Workload>().unwrap(),
            Workload::KvBatch("kv".into(), 50)
        );
        assert!("kv-batch:kv".parse::<Workload>().is_err());
        assert!("kv-batch:kv:0".parse::<Workload>().is_err());
        assert!("kv-batch:a b:5".parse::<Workload>().is_err());
        assert!("kv-put:a b".parse::<Workload>().is_err());
        let mut soak = Requests {
            host: "h:1".into(),
            prefix: "bench/r/1/0".into(),
            workload: Workload::Soak,
            sequence: 0,
            client_ids: ClientIds::Counter,
            random_state: 0,
        };
        let requests: Vec<String> = (0..20).map(|_| soak.next().0).collect();
        // Every delete names the session created two requests before it.
        for (i, request) in requests.iter().enumerate() {
            if let Some(rest) = request.strip_prefix("DELETE /v1/sessions/") {
                let id = rest.split(' ').next().unwrap().replace("%2F", "/");
                assert!(
                    requests[i - 2].contains(&format!(r#""client_id":"{id}""#)),
                    "{request} after {}",
                    requests[i - 2]
                );
            }
        }
        assert_eq!(
            requests.iter().filter(|r| r.starts_with("DELETE")).count(),
            2
        );
        assert_eq!(
            requests
                .iter()
                .filter(|r| r.contains(r#""session_expiry_interval_secs":5,"#))
                .count(),
            2
        );
        let mut requests = Requests {
            host: "h:1".into(),
            prefix: "bench/r/1/0".into(),
            workload: Workload::Mixed,
            sequence: 0,
            client_ids: ClientIds::Counter,
            random_state: 0,
        };
        let kinds: Vec<String> = (0..10)
            .map(|_| requests.next().0.split(' ').next().unwrap().to_string())
            .collect();
        assert_eq!(kinds.iter().filter(|k| *k == "GET").count(), 5);
        assert_eq!(kinds.iter().filter(|k| *k == "PATCH").count(), 3);
        assert_eq!(kinds.iter().filter(|k| *k == "POST").count(), 2);
        let (get, _) = Requests {
            workload: Workload::Get("stale".into()),
            ..requests
        }
        .next();
        assert!(
            get.starts_with("GET /v1/sessions/bench%2Fr%2F1%2F0%2Fseed%2F"),
            "{get}"
        );
        assert!(get.contains("consistency=stale"), "{get}");
    }

    #[test]
    fn created_client_ids_count_or_look_random() {
        let created = |client_ids: ClientIds, random_state: u64| -> Vec<String> {
            let mut requests = Requests {
                host: "h:1".into(),
                prefix: "bench/r/1/0".into(),
                workload: Workload::Create,
                sequence: 0,
                client_ids,
                random_state,
            };
            (0..1000)
                .map(|_| {
                    let request = requests.next().0;
                    let body = request.split("\r\n\r\n").nth(1).unwrap().to_string();
                    let start = body.find(r#""client_id":""#).unwrap() + 13;
                    let end = start + body[start..].find('"').unwrap();
                    body[start..end].to_string()
                })
                .collect()
        };
        let counted = created(ClientIds::Counter, 0);
        assert_eq!(counted[0], "bench/r/1/0/1");
        assert_eq!(counted[999], "bench/r/1/0/1000");
        let random = created(ClientIds::Random, 7);
        let distinct: std::collections::HashSet<&String> = random.iter().collect();
        assert_eq!(distinct.len(), 1000);
        assert!(
            random
                .iter()
                .all(|id| id.starts_with("bench/r/1/0/") && id.len() == 28)
        );
        // In sorted order, consecutive random creations land far apart.
        let mut sorted = random.clone();
        sorted.sort();
        let position = |id: &String| sorted.binary_search(id).unwrap() as i64;
        let far_apart = random
            .windows(2)
            .filter(|pair| (position(&pair[0]) - position(&pair[1])).abs() > 10)
            .count();
        assert!(far_apart > 900, "{far_apart}");
        // Another connection (another seed) makes other ids.
        assert_ne!(created(ClientIds::Random, 8)[0], random[0]);
        assert_eq!("random".parse::<ClientIds>().unwrap(), ClientIds::Random);
        assert!("sorted".parse::<ClientIds>().is_err());
    }
}
