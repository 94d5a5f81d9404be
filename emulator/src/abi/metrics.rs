//! Metrics: one stat per name across the VM copies, with Envoy's
//! counter, gauge and histogram rules.

use crate::world::{Metric, MetricKind, World};

use super::memory::{read, write, write_u32};
use super::{status, with_world, Fail, Hc, BAD_ARGUMENT, C, NOT_FOUND};

pub(super) fn proxy_define_metric(
    c: &mut C,
    kind: i32,
    name_ptr: i32,
    name_len: i32,
    id_ptr: i32,
) -> Hc {
    let name = String::from_utf8_lossy(&read(c, name_ptr, name_len)?).into_owned();
    let kind = match kind {
        0 => MetricKind::Counter,
        1 => MetricKind::Gauge,
        2 => MetricKind::Histogram,
        _ => {
            return Err(status(
                BAD_ARGUMENT,
                format!("{name:?}: metric type {kind}"),
            ))
        }
    };
    // One stat per name, shared by every VM copy (Envoy's stats scope).
    let id = with_world(c, |w, _| {
        if let Some(i) = w.metrics.iter().position(|m| m.name == name) {
            return i + 1;
        }
        let null = w.rejected_stats.contains(&name);
        w.metrics.push(Metric {
            name: name.clone(),
            kind,
            value: 0,
            samples: Vec::new(),
            null,
        });
        w.metrics.len()
    });
    write_u32(c, id_ptr, id as u32)?;
    Ok(format!("{kind:?} {name:?}: id {id}"))
}

fn metric_mut(w: &mut World, id: i32) -> Result<&mut Metric, Fail> {
    usize::try_from(id)
        .ok()
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| w.metrics.get_mut(i))
        .ok_or_else(|| status(NOT_FOUND, format!("metric id {id}")))
}

pub(super) fn proxy_increment_metric(c: &mut C, id: i32, offset: i64) -> Hc {
    with_world(c, |w, _| {
        let now = w.elapsed();
        let m = metric_mut(w, id)?;
        if m.null {
            return Ok(format!("{} (null stat) += {offset}", m.name));
        }
        match m.kind {
            // Envoy: counters only go up.
            MetricKind::Counter if offset <= 0 => {
                return Err(status(
                    BAD_ARGUMENT,
                    format!("{}: counter += {offset}", m.name),
                ))
            }
            MetricKind::Counter | MetricKind::Gauge => m.value += offset,
            MetricKind::Histogram => {
                return Err(status(BAD_ARGUMENT, format!("{}: histogram", m.name)))
            }
        }
        let mut detail = format!("{} += {offset}: {}", m.name, m.value);
        if m.value < 0 {
            // Envoy's gauges are u64: this would wrap there.
            detail.push_str(&format!(" [NEGATIVE GAUGE at {now:?}]"));
        }
        Ok(detail)
    })
}

pub(super) fn proxy_record_metric(c: &mut C, id: i32, value: i64) -> Hc {
    with_world(c, |w, _| {
        let m = metric_mut(w, id)?;
        if m.null {
            return Ok(format!("{} (null stat) = {value}", m.name));
        }
        let value = value as u64;
        match m.kind {
            MetricKind::Counter => m.value += value as i64,
            MetricKind::Gauge => m.value = value as i64,
            MetricKind::Histogram => m.samples.push(value),
        }
        Ok(format!("{} = {value}", m.name))
    })
}

pub(super) fn proxy_get_metric(c: &mut C, id: i32, ptr: i32) -> Hc {
    let value = with_world(c, |w, _| {
        let m = metric_mut(w, id)?;
        match m.kind {
            MetricKind::Histogram => Err(status(BAD_ARGUMENT, format!("{}: histogram", m.name))),
            _ => Ok(m.value as u64),
        }
    })?;
    write(c, ptr as u32, &value.to_le_bytes())?;
    Ok(format!("{id}: {value}"))
}
