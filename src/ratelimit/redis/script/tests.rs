//! The script's packing and its reply, decision by decision and run by run.
use super::*;
use std::time::Duration;

/// A reply as the script packs it.
fn packed(numbers: &[f64]) -> Value {
    Value::BulkString(numbers.iter().flat_map(|n| n.to_le_bytes()).collect())
}

/// Ten tokens per `ns` nanoseconds: an interval of `ns / 10`, a burst of `ns`.
fn ten_per(ns: u64) -> Gcra {
    let ten = std::num::NonZeroU32::new(10).unwrap_or(std::num::NonZeroU32::MIN);
    Gcra::new(&crate::ratelimit::Quota::new(ten, Duration::from_nanos(ns)))
}

fn run(len: usize, first: Op, then: Option<Op>) -> Run {
    let g = ten_per(100);
    Run {
        len,
        first: (g, first),
        then: then.map(|op| (g, op)),
        credit: None,
    }
}

#[test]
fn a_run_s_credits_are_read_after_its_decisions_and_spent_while_they_last() {
    let credited = Run {
        credit: Some(1),
        ..run(1, Op::Peek, Some(Op::Check))
    };
    let alone = Run {
        credit: Some(1),
        ..run(1, Op::Check, None)
    };
    let three = Run {
        credit: Some(1),
        ..run(3, Op::Check, None)
    };
    let reply = packed(&[2.0, 5.0, 7.0, 9.0, 42.0, 1.0, 0.0, 3.0, -1.0, 70.0, 2.0]);
    let answers = parse(reply, &[credited, alone, alone, three]).unwrap();
    let credits: Vec<_> = answers.iter().map(|a| a.credit).collect();
    assert_eq!(
        credits,
        [
            Some(Credited::Spent(41)),
            Some(Credited::Short(0)),
            None,
            // Three allowed checks (debts 70, 80, 90 of 100) on a count of 2.
            Some(Credited::Spent(1)),
            Some(Credited::Spent(0)),
            Some(Credited::Short(0)),
        ]
    );
    // A refused decision spends nothing; a fraction or a negative is no count.
    let refused = packed(&[2.0, 5.0, 100.0, 5.0]);
    assert_eq!(parse(refused, &[alone]).unwrap()[0].credit, None);
    assert!(parse(packed(&[2.0, 5.0, 1.0, 0.5]), &[alone]).is_err());
    assert!(parse(packed(&[2.0, 5.0, 1.0, -2.0]), &[alone]).is_err());
    assert!(parse(packed(&[2.0, 5.0, 1.0]), &[alone]).is_err());
}

#[test]
fn replies_are_checked_for_shape() {
    let one = [run(1, Op::Check, None)];
    let answers = parse(packed(&[2.0, 5.0, 7.0]), &one).unwrap();
    assert_eq!(
        answers,
        [Answer {
            now: 2_000_005_000,
            debt: 7,
            then: None,
            credit: None,
        }]
    );
    assert!(parse(packed(&[2.0, 5.0]), &one).is_err());
    assert!(parse(packed(&[2.0, 5.0, -1.0]), &one).is_err());
    assert!(parse(packed(&[2.0, 5.0, 7.5]), &one).is_err());
    assert!(parse(packed(&[2.0, 5.0, f64::NAN]), &one).is_err());
    let ragged = Value::BulkString(vec![0; 23]);
    assert!(parse(ragged, &one).is_err());
    assert!(parse(Value::Array(vec![Value::Int(2), Value::Int(5)]), &[]).is_err());
    assert!(parse(Value::Nil, &[]).is_err());
}

#[test]
fn a_second_decision_is_read_with_its_first_and_may_be_skipped() {
    let reply = packed(&[2.0, 5.0, 7.0, 9.0, 1.0, 3.0, -1.0]);
    let runs = [
        run(1, Op::Peek, Some(Op::Check)),
        run(1, Op::Check, None),
        run(1, Op::Peek, Some(Op::Check)),
    ];
    let answers = parse(reply, &runs).unwrap();
    let debts: Vec<_> = answers.iter().map(|a| (a.debt, a.then)).collect();
    assert_eq!(debts, [(7, Some(9)), (1, None), (3, None)]);
    // A skip only stands for a second decision; a pair needs its second debt.
    assert!(parse(packed(&[2.0, 5.0, -1.0, 9.0]), &runs[..1]).is_err());
    assert!(parse(packed(&[2.0, 5.0, 7.0]), &runs[..1]).is_err());
}

#[test]
fn each_decision_of_a_run_sees_what_the_one_before_it_left() {
    // Interval 10, burst 100: from a debt of 70, three checks are allowed of five.
    let reply = packed(&[2.0, 5.0, 70.0, 90.0, 0.0, 90.0, 100.0, -1.0]);
    let runs = [
        run(5, Op::Check, None),
        run(3, Op::Consume, None),
        run(2, Op::Peek, Some(Op::Check)),
        run(2, Op::Peek, Some(Op::Consume)),
    ];
    let answers = parse(reply, &runs).unwrap();
    let debts: Vec<_> = answers.iter().map(|a| (a.debt, a.then)).collect();
    assert_eq!(
        debts,
        [
            (70, None),
            (80, None),
            (90, None),
            (100, None),
            (100, None),
            // A refused consume leaves the bucket drained.
            (90, None),
            (100, None),
            (100, None),
            // The peeks see one debt; the checks after them take a token each, or
            // none is made.
            (0, Some(90)),
            (0, Some(100)),
            (100, None),
            (100, None),
        ]
    );
    assert!(parse(packed(&[2.0, 5.0, 70.0]), &runs).is_err());
}

fn pending(key: &str, gcra: Gcra, op: Op, then: Option<Step>) -> Pending {
    Pending {
        key: key.into(),
        gcra,
        op,
        then,
        credit: None,
        reply: oneshot::channel().0,
    }
}

/// The arguments of `cmd`, each as bytes.
fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .map(|arg| match arg {
            ::redis::Arg::Simple(bytes) => bytes.to_vec(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn a_call_names_each_key_and_pair_once_and_packs_the_decisions() {
    let (a, b) = (ten_per(100), ten_per(200));
    let guard = |key: &str| Step {
        key: key.into(),
        gcra: b,
        op: Op::Check,
    };
    let credited = Pending {
        credit: Some(CreditStep {
            key: "cr".into(),
            args: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        }),
        ..pending("k1", b, Op::Consume, None)
    };
    let batch = [
        pending("ip1", a, Op::Peek, Some(guard("k1"))),
        pending("ip1", a, Op::Peek, Some(guard("k2"))),
        pending("k1", b, Op::Consume, None),
        credited,
        pending("k1", b, Op::Consume, None),
    ];
    let args = args(&script_cmd("EVALSHA", "sha", &batch, &runs(&batch)));
    let params: Vec<u8> = [10.0_f64, 100.0, 20.0, 200.0]
        .iter()
        .flat_map(|n| n.to_le_bytes())
        .collect();
    let credit_args: Vec<u8> = (1..=8).flat_map(|n| f64::from(n).to_le_bytes()).collect();
    let text: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    assert_eq!(
        text,
        [
            &b"EVALSHA"[..],
            b"sha",
            b"4",
            b"ip1",
            b"k1",
            b"k2",
            b"cr",
            // The two pairs, interval then burst, as doubles.
            &params,
            // Three runs of one: its length (top bit: paired), then each decision's
            // key index and pair * 8 + op.
            &[
                0x80, 1, 0, 0, 0, 1, 0, 1, 0, 8, //
                0x80, 1, 0, 0, 0, 1, 0, 2, 0, 8, //
                0, 1, 0, 1, 0, 10, //
                // A credited decision (bit 14): a run of its own, then its count's
                // key index and its numbers' index; and the alike one after it, too.
                0x40, 1, 0, 1, 0, 10, 0, 3, 0, 0, //
                0, 1, 0, 1, 0, 10,
            ],
            // The credit step's numbers, as doubles.
            &credit_args,
        ]
    );
}

#[test]
fn alike_decisions_in_a_row_go_as_one_run() {
    let (a, b) = (ten_per(100), ten_per(200));
    let step = |key: &str, op| {
        Some(Step {
            key: key.into(),
            gcra: b,
            op,
        })
    };
    let guarded = |first: Op, key: &str| pending("ip", a, first, step(key, Op::Check));
    // Whole-day quotas: burst + interval past 2^53 - 1, so no run.
    let huge = Gcra::new(&crate::ratelimit::Quota::new(
        std::num::NonZeroU32::MIN,
        Duration::from_nanos(MAX_BURST_NANOS),
    ));
    let batch = [
        guarded(Op::Peek, "k1"),
        guarded(Op::Peek, "k1"),
        guarded(Op::Peek, "k1"),
        guarded(Op::Peek, "k2"),
        pending("k1", b, Op::Consume, None),
        pending("k1", b, Op::Consume, None),
        pending("k1", a, Op::Consume, None),
        // A pair whose first decision takes a token: each first changes what the next
        // sees, so each goes alone.
        guarded(Op::Check, "k1"),
        guarded(Op::Check, "k1"),
        // A pair on one key: the second changes what the next first sees.
        pending("ip", a, Op::Peek, step("ip", Op::Consume)),
        pending("ip", a, Op::Peek, step("ip", Op::Consume)),
        pending("big", huge, Op::Check, None),
        pending("big", huge, Op::Check, None),
    ];
    let lens: Vec<usize> = runs(&batch).iter().map(|run| run.len).collect();
    assert_eq!(lens, [3, 1, 2, 1, 1, 1, 1, 1, 1, 1]);
    let args = args(&script_cmd(
        "EVALSHA",
        "sha",
        &batch[..3],
        &runs(&batch[..3]),
    ));
    assert_eq!(args[6], [0x80, 3, 0, 0, 0, 1, 0, 1, 0, 8]);
}

#[test]
fn distinct_items_keep_their_first_index_past_the_linear_search() {
    let mut keys = Distinct::default();
    let names: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(keys.index(name.as_str()), i);
    }
    for (i, name) in names.iter().enumerate().rev() {
        assert_eq!(keys.index(name.as_str()), i);
    }
    assert_eq!(keys.items.len(), 20);
}

#[test]
fn large_debts_survive_the_packing() {
    // A thousand requests a day: a burst of 8.64e16 ns, past 2^53, read as the script
    // holds it.
    let day = 86_400_000_000_000_u64 * 1_000;
    let answers = parse(packed(&[2.0, 5.0, day as f64]), &[run(1, Op::Check, None)]).unwrap();
    assert_eq!(answers[0].debt, day);
}
