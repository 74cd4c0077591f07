//! Which requests are recorded: OpenTelemetry's parent-based ratio sampler
//! (`parentbased_traceidratio`), decided once per request without building
//! the SDK's context for it.
use super::context::Parent;

/// A caller's sampled trace is recorded, its unsampled one is not; a trace
/// the gateway starts is recorded when its id falls under `ratio`, the rule
/// of the SDK's `TraceIdRatioBased` (so every service with the same ratio
/// keeps the same traces).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Sampler {
    /// Trace ids whose low 63 bits read below this are sampled.
    bound: u64,
    always: bool,
}

// === impl Sampler ===

impl Sampler {
    /// Samples `ratio` (0 to 1) of the traces the gateway starts.
    pub(super) fn new(ratio: f64) -> Sampler {
        Sampler {
            bound: (ratio.max(0.0) * (1u64 << 63) as f64) as u64,
            always: ratio >= 1.0,
        }
    }

    /// Whether the request's span is recorded and exported.
    #[inline]
    pub(super) fn sampled(&self, parent: Option<&Parent>, trace_id: &[u8; 16]) -> bool {
        match parent {
            Some(p) => p.sampled,
            None => self.always || root_sampled(self.bound, trace_id),
        }
    }
}

/// The SDK's ratio rule: the trace id's last eight bytes, shifted right by
/// one, below the bound.
fn root_sampled(bound: u64, trace_id: &[u8; 16]) -> bool {
    let low = u64::from_be_bytes(trace_id[8..].try_into().expect("eight bytes"));
    (low >> 1) < bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanKind, TraceId};
    use opentelemetry_sdk::trace::{Sampler as SdkSampler, SamplingDecision, ShouldSample};

    fn sdk_sampled(ratio: f64, trace_id: [u8; 16]) -> bool {
        let sampler = SdkSampler::ParentBased(Box::new(SdkSampler::TraceIdRatioBased(ratio)));
        let result = sampler.should_sample(
            None,
            TraceId::from_bytes(trace_id),
            "request",
            &SpanKind::Server,
            &[],
            &[],
        );
        result.decision == SamplingDecision::RecordAndSample
    }

    #[test]
    fn roots_are_sampled_exactly_as_the_sdk_samples_them() {
        for ratio in [0.0, 0.01, 0.05, 0.25, 0.5, 0.999, 1.0] {
            let ours = Sampler::new(ratio);
            let mut agree = 0;
            let mut kept = 0;
            for _ in 0..20_000 {
                let id: [u8; 16] = rand::random();
                let sampled = ours.sampled(None, &id);
                assert_eq!(sampled, sdk_sampled(ratio, id), "ratio {ratio}, id {id:?}");
                agree += 1;
                kept += usize::from(sampled);
            }
            let share = kept as f64 / agree as f64;
            assert!((share - ratio).abs() < 0.02, "ratio {ratio} kept {share}");
        }
    }

    #[test]
    fn a_callers_decision_is_followed_whatever_the_ratio() {
        let parent = |sampled| Parent {
            trace_id: [7; 16],
            span_id: [1; 8],
            sampled,
        };
        assert!(Sampler::new(0.0).sampled(Some(&parent(true)), &[7; 16]));
        assert!(!Sampler::new(1.0).sampled(Some(&parent(false)), &[7; 16]));
    }
}
