//! Every configuration error the contract lists (unknown fields, wrong
//! types, bad durations, empty or invalid header names, out-of-range
//! values, malformed documents) makes the real `.wasm` refuse to start:
//! `proxy_on_configure` returns false, and the VM copy logs exactly one
//! line, naming the field.

use std::time::Duration;

use graceful_emulated_host::{Filter, Host, Level, StartError};

/// Starts `filter` with `config`; it must be refused with one error line
/// that names `field` (or, for `""`, says the document is invalid).
fn assert_refused(filter: Filter, config: &[u8], field: &str) {
    let mut host = Host::new();
    let shown = String::from_utf8_lossy(config);
    let logs = match host.try_start_vm(filter, config) {
        Err(StartError::Refused { callback, logs }) => {
            assert_eq!(callback, "proxy_on_configure", "{shown}");
            logs
        }
        other => panic!("{} accepted {shown:?}: {other:?}", filter.name()),
    };
    let lines: Vec<&str> = logs
        .iter()
        .filter(|l| l.level >= Level::Warn)
        .map(|l| l.message.as_str())
        .collect();
    assert_eq!(lines.len(), 1, "{shown}: one line, got {lines:?}");
    let line = lines[0];
    assert!(
        line.starts_with(&format!("{}: invalid configuration: ", filter.name())),
        "{shown}: {line}"
    );
    if field.is_empty() {
        assert!(!line.contains("field \""), "{shown}: {line}");
    } else {
        assert!(
            line.contains(&format!("field \"{field}\": ")),
            "{shown}: expected field {field:?} in {line:?}"
        );
    }
    assert!(!line.contains('\n'), "one line: {line:?}");
    // Refused before touching shared data.
    assert_eq!(host.shared_data("graceful.v1.instance"), None, "{shown}");
}

fn refused_all(filter: Filter, cases: &[(&str, &str)]) {
    for (json, field) in cases {
        assert_refused(filter, json.as_bytes(), field);
    }
}

/// Documents that are not a JSON object, for every filter.
const MALFORMED: &[&[u8]] = &[
    b"{",
    b"[]",
    b"null",
    b"\"x\"",
    b"{} {}",
    b"{\"a\":1,}",
    b"\xef\xbb\xbf{}",
    b"\xff\xfe",
    b"{\"closing_header\":\"\xff\"}",
];

#[test]
fn it_refuses_malformed_documents_in_every_filter() {
    for filter in [Filter::Provider, Filter::Drain, Filter::Consumer] {
        for config in MALFORMED {
            let mut host = Host::new();
            let err = host.try_start_vm(filter, config).unwrap_err();
            let StartError::Refused { logs, .. } = err else {
                panic!("{err:?}");
            };
            let errors: Vec<_> = logs.iter().filter(|l| l.level >= Level::Warn).collect();
            assert_eq!(errors.len(), 1, "{config:?}: {errors:?}");
            assert!(
                errors[0].message.contains("invalid configuration"),
                "{errors:?}"
            );
        }
    }
}

#[test]
fn it_refuses_every_bad_provider_field() {
    let long_id = format!(r#"{{"instance_id":"{}"}}"#, "x".repeat(129));
    refused_all(
        Filter::Provider,
        &[
            (r#"{"closing_header":""}"#, "closing_header"),
            (r#"{"closing_header":7}"#, "closing_header"),
            (r#"{"closing_header":"bad header"}"#, "closing_header"),
            (r#"{"closing_header":":status"}"#, "closing_header"),
            (r#"{"instance_header":"x\ny"}"#, "instance_header"),
            (r#"{"instance_header":5}"#, "instance_header"),
            (
                r#"{"instance_header":"X-Graceful-Closing"}"#,
                "instance_header",
            ),
            (r#"{"instance_id":""}"#, "instance_id"),
            (r#"{"instance_id":"a b"}"#, "instance_id"),
            (long_id.as_str(), "instance_id"),
            (
                r#"{"immediate_health_check_fail":"yes"}"#,
                "immediate_health_check_fail",
            ),
            (r#"{"reject_when_drained":1}"#, "reject_when_drained"),
            (r#"{"closing_headr":"x"}"#, "closing_headr"),
            // An explicit null is refused, never read as "absent".
            (r#"{"closing_header":null}"#, "closing_header"),
            (r#"{"instance_id":null}"#, "instance_id"),
        ],
    );
}

#[test]
fn it_refuses_every_bad_drain_field() {
    refused_all(
        Filter::Drain,
        &[
            (r#"{"consumer_update_wait":"3"}"#, "consumer_update_wait"),
            (r#"{"consumer_update_wait":3}"#, "consumer_update_wait"),
            (r#"{"quiet_window":"-1s"}"#, "quiet_window"),
            (r#"{"quiet_window":"fast"}"#, "quiet_window"),
            (r#"{"step_timeout":"1d"}"#, "step_timeout"),
            (r#"{"timeout":"25h"}"#, "timeout"),
            (r#"{"timeout":60}"#, "timeout"),
            (r#"{"consumer_update_wait":"5s","timeout":"4s"}"#, "timeout"),
            (r#"{"allowed_sources":"127.0.0.1"}"#, "allowed_sources"),
            (r#"{"allowed_sources":[1]}"#, "allowed_sources[0]"),
            (
                r#"{"allowed_sources":["127.0.0.0/8","10.0.0.0/33"]}"#,
                "allowed_sources[1]",
            ),
            (r#"{"allowed_sources":["nope"]}"#, "allowed_sources[0]"),
            (r#"{"admin_cluster":""}"#, "admin_cluster"),
            (r#"{"admin_cluster":5}"#, "admin_cluster"),
            (r#"{"on_drained":"app"}"#, "on_drained"),
            (r#"{"on_drained":{"path":"/x"}}"#, "on_drained"),
            (r#"{"on_drained":{"cluster":""}}"#, "on_drained.cluster"),
            (
                r#"{"on_drained":{"cluster":"app","path":"x"}}"#,
                "on_drained.path",
            ),
            (
                r#"{"on_drained":{"cluster":"app","timeout":"0s"}}"#,
                "on_drained.timeout",
            ),
            (
                r#"{"on_drained":{"cluster":"app","timeout":"61s"}}"#,
                "on_drained.timeout",
            ),
            (
                r#"{"on_drained":{"cluster":"app","extra":1}}"#,
                "on_drained.extra",
            ),
            (r#"{"max_waiters":-1}"#, "max_waiters"),
            (r#"{"max_waiters":10001}"#, "max_waiters"),
            (r#"{"max_waiters":1.5}"#, "max_waiters"),
            (r#"{"paths":{"ready":"graceful/ready"}}"#, "paths.ready"),
            (r#"{"paths":{"status":"/s?x=1"}}"#, "paths.status"),
            (r#"{"paths":{"grpc_health":"/a b"}}"#, "paths.grpc_health"),
            (r#"{"paths":{"status":"/graceful/ready"}}"#, "paths.status"),
            (r#"{"paths":{"closng":"/c"}}"#, "paths.closng"),
            (r#"{"paths":[]}"#, "paths"),
            (r#"{"quiet_windw":"5s"}"#, "quiet_windw"),
            (r#"{"quiet_window":null}"#, "quiet_window"),
            (
                r#"{"allowed_sources":["10.0.0.0/8",null]}"#,
                "allowed_sources[1]",
            ),
            (r#"{"paths":{"ready":null}}"#, "paths.ready"),
            (
                r#"{"on_drained":{"cluster":"app","timeout":null}}"#,
                "on_drained.timeout",
            ),
            (r#"{"paths":null}"#, "paths"),
        ],
    );
}

#[test]
fn it_refuses_every_bad_consumer_field() {
    refused_all(
        Filter::Consumer,
        &[
            (r#"{"closing_headers":["ok",""]}"#, "closing_headers[1]"),
            (r#"{"closing_headers":"closing"}"#, "closing_headers"),
            (r#"{"closing_headers":["a b"]}"#, "closing_headers[0]"),
            (r#"{"instance_header":"a b"}"#, "instance_header"),
            (r#"{"instance_header":1}"#, "instance_header"),
            (r#"{"tombstone_ttl":"0s"}"#, "tombstone_ttl"),
            (r#"{"tombstone_ttl":"30"}"#, "tombstone_ttl"),
            (r#"{"tombstone_ttl":30}"#, "tombstone_ttl"),
            (
                r#"{"evict_on_connect_failure":"true"}"#,
                "evict_on_connect_failure",
            ),
            (
                r#"{"failure_tombstone_ttl":"0ms"}"#,
                "failure_tombstone_ttl",
            ),
            (r#"{"failure_tombstone_ttl":"x"}"#, "failure_tombstone_ttl"),
            (r#"{"override_host_header":""}"#, "override_host_header"),
            (
                r#"{"override_host_header":"closing"}"#,
                "override_host_header",
            ),
            (
                r#"{"override_host_header":"x-graceful-instance"}"#,
                "override_host_header",
            ),
            (r#"{"admin_cluster":""}"#, "admin_cluster"),
            (r#"{"membership_refresh":"10ms"}"#, "membership_refresh"),
            (r#"{"membership_refresh":"2h"}"#, "membership_refresh"),
            (r#"{"membership_refresh":"1"}"#, "membership_refresh"),
            (r#"{"max_tombstones":0}"#, "max_tombstones"),
            (r#"{"max_tombstones":65537}"#, "max_tombstones"),
            (r#"{"max_tombstones":-3}"#, "max_tombstones"),
            (r#"{"max_tombstones":"8"}"#, "max_tombstones"),
            (r#"{"probe_path":"ready"}"#, "probe_path"),
            (r#"{"probe_path":"/a?b"}"#, "probe_path"),
            (r#"{"tombstone_tll":"5s"}"#, "tombstone_tll"),
            (r#"{"max_tombstones":null}"#, "max_tombstones"),
            (r#"{"closing_headers":[null]}"#, "closing_headers[0]"),
        ],
    );
}

#[test]
fn it_starts_with_empty_and_with_complete_configurations() {
    let cases: &[(Filter, &str, Option<Duration>)] = &[
        // The provider ticks to end its long-lived streams once drained.
        (Filter::Provider, "", Some(Duration::from_millis(100))),
        (Filter::Provider, " \n", Some(Duration::from_millis(100))),
        (
            Filter::Provider,
            r#"{"closing_header":"Closing","instance_header":"X-Pod","instance_id":"pod-7",
               "immediate_health_check_fail":true,"reject_when_drained":false,
               "long_lived_paths":["/events","/stream/*"],"long_lived_upgrades":false}"#,
            Some(Duration::from_millis(100)),
        ),
        (Filter::Drain, "{}", Some(Duration::from_millis(50))),
        (
            Filter::Drain,
            r#"{"consumer_update_wait":"0s","quiet_window":"1.5s","step_timeout":"1m30s","timeout":"24h",
               "allowed_sources":["10.0.0.0/8","::1/128"],"admin_cluster":"envoy_admin",
               "on_drained":{"cluster":"app","path":"/bye","timeout":"60s"},"max_waiters":0,
               "paths":{"closing":"/c","ready":"/r","status":"/s","drained":"/d","grpc_health":"/g"}}"#,
            Some(Duration::from_millis(50)),
        ),
        // Ticks at most every 100 ms (refreshes stay one per
        // membership_refresh, by the lease).
        (Filter::Consumer, "", Some(Duration::from_millis(100))),
        (
            Filter::Consumer,
            r#"{"membership_refresh":"5s"}"#,
            Some(Duration::from_millis(100)),
        ),
        (
            Filter::Consumer,
            r#"{"closing_headers":["Closing","X-Shutdown"],"instance_header":"","tombstone_ttl":"10s",
               "evict_on_connect_failure":false,"failure_tombstone_ttl":"2s","override_host_header":"X-Pin",
               "admin_cluster":"admin","membership_refresh":"100ms","max_tombstones":65536,"probe_path":"",
               "panic_threshold":100}"#,
            Some(Duration::from_millis(100)),
        ),
    ];
    for (filter, config, tick) in cases {
        let mut host = Host::new();
        let vm = host
            .try_start_vm(*filter, config)
            .unwrap_or_else(|e| panic!("{config}: {e:?}"));
        assert_eq!(host.tick_period(vm), *tick, "{config}");
        assert!(
            host.logs_at_least(Level::Warn).is_empty(),
            "{:?}",
            host.logs()
        );
        assert!(!host.is_dead(vm));
    }
}
