"""From comparisons to a verdict: PASS, FAIL or INCONCLUSIVE.

**The bound.** A correct float32 conversion differs from PyTorch by rounding, and how much
rounding costs depends on the weights and the input. So every output and layer is held to
``bound = max(tol, K × noise)``, where ``noise`` is PyTorch's own float32 output against
its float64 output on that very tensor. :data:`K` was chosen from measurements: on a
torchvision ResNet50 with BatchNorm statistics estimated on data, MindSpore-vs-PyTorch
error over float32 noise was 1.30 (median) and 1.32 (max) over 106 layers and the output
(error 2.0e-5, noise 1.6e-5); EfficientNet's sigmoid rounds ~5× coarser in MindSpore than
in PyTorch per op. ``K = 4`` keeps three times the ResNet margin; wrong conversions
(swapped statistics, rolled rows, a transposed weight) err by 1e-2 to 1, far above.

**Drift.** PyTorch's float32 rounding is unbiased; some of MindSpore's kernels are not
(its float32 sigmoid, measured on 400k values: 2.1e-7 relative error, 4.3e-8 of it a
bias of one sign, against PyTorch's 3.8e-8 and 4e-10). A biased error adds up coherently
through the depth while PyTorch's noise does not, so the ratio error/noise of a correct
conversion *grows* along a network built of such ops: torchvision EfficientNet into
MindCV's, padded alike, climbs smoothly from 0.9 at the stem to peaks of 14.0 (B0),
25.1 (B1), 15.9 (B3) and 20.3 (B7) at 64×64 with MindSpore's CPU kernels capped at AVX2
(9.7, 16.7 and 16.9 for B0, B3, B7 under oneDNN's reference convolution) — never more
than 2.1× the level before it. A wrong weight or a
differing layer does the opposite: its error jumps at the layer where it sits. So each
layer's bound is ``max(tol, K × noise × drift)``, where ``drift`` (≥ 1) is the level
the error/noise ratio has climbed to, in execution order, through layers whose error
stayed within half their bound (ratio ≤ :data:`RISE` × drift, ``RISE = K / 2``): a layer
above the level raises it to its own ratio; otherwise the level relaxes towards the
ratios of the layers since, halving over :data:`HALF_LIFE` (32) of them. So the drift
follows a gradual climb; a layer that departs from it — within its bound but more than
twice the drift — does not raise it for the layers after; and a peak in a side branch
does not loosen the whole rest of the network. Measured on EfficientNet-B0 (MindSpore's
CPU kernels capped at AVX2): the ratio peaks at 14 in a squeeze-and-excitation's pooled
vector while the trunk after it stays near 5.4; held at its peak, the drift let a
BatchNorm epsilon changed deep inside (1e-5 → 1e-4, 42× the noise) pass its own bound
and fail only at the output, by 1.1×; relaxed, it FAILs at that BatchNorm. Correct
conversions keep at least 2.5× of margin under every bound with a half-life of 32 (B0 at
64 and 224 pixels, B3, B7, ResNet50, MobileNetV2, DenseNet121, ViT), 1.3× with 16. The
outputs use the level the drift ends at; the report gives its peak and where.
:data:`DRIFT_CAP` caps it above every correct conversion measured (25.1 at most):
beyond 32× PyTorch's own rounding nothing is called rounding. Why half the bound: a drift
that any passing layer could raise (RISE = K) let the same epsilon change PASS at 60× the
noise. Without recorded layers the drift is 1.

**Sensitivity.** Agreement proves something only where a wrong conversion would show.
PyTorch is run on a second, different input; an output whose relative change is below
:data:`SENSITIVITY` × its bound barely depends on its input (a randomly initialised deep
net, a zero-initialised head): it cannot tell right weights from wrong ones, and the
verdict is INCONCLUSIVE, never PASS. A *layer* that barely depends on the input is
reported (status ``insensitive``) but does not by itself make the verdict inconclusive:
its own weights are still compared directly, tensor by tensor, before any forward.

FAIL beats INCONCLUSIVE beats PASS.
"""

from __future__ import annotations

import math

from .compare import fmt
from .report import FAIL, INCONCLUSIVE, PASS, LayerComparison, OutputComparison

#: the bound is max(tol, K × noise); see the module docstring for the measurements
K = 4.0
#: an output whose change between two inputs is below SENSITIVITY × its bound is
#: inconclusive
SENSITIVITY = 10.0
#: the most that rounding compounding through the depth may add to K (module docstring)
DRIFT_CAP = 32.0
#: a layer raises the drift only when its error/noise ratio is at most RISE × the drift
RISE = K / 2
#: accepted layers over which the drift halves on its way back to the current level
HALF_LIFE = 32


def bound_for(tol: float, noise: float | None, *, scaled: bool = True,
              drift: float = 1.0) -> float:
    """``max(tol, K × noise × drift)``; ``tol`` alone when noise is unknown or not
    float32's."""
    if noise is None or not scaled or not math.isfinite(noise):
        return float(tol)
    return max(float(tol), K * noise * drift)


class Drift:
    """The error/noise level rounding has climbed to, from the layers within half their
    rounding bound (module docstring), fed each layer in execution order: ``ratio`` (what
    the next layer's bound uses), and ``peak`` / ``where``, the highest it reached.

    ``departure`` is where the error last left the climb (a layer within its bound but
    above RISE × drift) without any later layer returning under it: at the first failing
    layer it names where the difference more likely began."""

    def __init__(self) -> None:
        self.ratio = 1.0
        self.peak = 1.0
        self.where: str | None = None
        self.departure: str | None = None
        self._pending: str | None = None
        self._failed = False

    def judge(self, name: str, error: float, noise: float | None,
              sensitivity: float | None, *, tol: float, scaled: bool = True,
              own: float | None = None) -> tuple[float, str, float]:
        """The next layer in execution order: its bound, its status and the drift applied
        to it; then the layer moves the drift on. ``own``: its error given MindSpore's
        values before it (:mod:`.replay`); a layer above its bound whose own error is
        within it, no layer before it having failed, is ``amplified``."""
        drift = self.ratio
        bound = bound_for(tol, noise, scaled=scaled, drift=drift)
        status = status_of(error, bound, sensitivity)
        if status == "fail" and own is not None and own <= bound and not self._failed:
            status = "amplified"
        self._feed(name, error, noise, bound, status)
        return bound, status, drift

    def _feed(self, name: str, e: float, n: float | None, bound: float, status: str) -> None:
        if status in ("fail", "nonfinite"):
            if not self._failed:
                self._failed, self.departure = True, self._pending
            return
        if status == "amplified":
            return  # its input's rounding, carried up: no level for the layers after
        if status not in ("ok", "insensitive") or not n or not math.isfinite(n) \
                or not math.isfinite(e):
            return  # unmeasured: says nothing about rounding
        if e > RISE * n * self.ratio:
            if self._pending is None and bound <= K * n * self.ratio:  # not tol's
                self._pending = (f"{name}: {e / n:.0f}× its noise against a drift "
                                 f"of {self.ratio:.1f}")
            return  # bounded by tol or departing: not a gradual climb
        self._pending = None
        # the level of the layers just passed: raised by a layer above it, relaxing
        # towards the current ratios otherwise (a peak in a side branch — a squeeze-and-
        # excitation's pooled vector — does not loosen the layers long after it)
        self.ratio = max(1.0, min(DRIFT_CAP, max(e / n, self.ratio * _RELAX)))
        if e / n > self.peak:
            self.peak, self.where = min(DRIFT_CAP, e / n), name


_RELAX = 0.5 ** (1 / HALF_LIFE)


#: below this relative change between two inputs a tensor counts as constant, whatever its
#: bound (with tol=0 and no measured noise the bound is 0: a constant must not PASS)
CONSTANT = 1e-12


def status_of(error: float, bound: float, sensitivity: float | None) -> str:
    if not math.isfinite(error):
        return "nonfinite"
    if not error <= bound:
        return "fail"
    if sensitivity is not None and sensitivity < max(SENSITIVITY * bound, CONSTANT):
        return "insensitive"
    return "ok"


#: the relative error float32 rounding alone has been seen to reach in a correct conversion
#: of a deep network (EfficientNet, ResNet50 with estimated BatchNorm statistics: 1-2e-5;
#: compounded through 100+ layers, 1e-4): past ten times that, no rounding explains a miss
ROUNDING_REACH = 1e-3


def decide(outputs: list[OutputComparison], layers: list[LayerComparison], *,
           problems: list[str], tensor_problems: list[str], first: str | None,
           tol: float, unmeasured: str | None = None) -> tuple[str, list[str]]:
    """The verdict and its reasons, one line each, most important first.

    ``unmeasured``: why the float32 noise that sets each bound was not measured. Then no
    bound is known but ``tol``: a miss within what float32 rounding alone reaches on deep
    networks (:data:`ROUNDING_REACH`) is INCONCLUSIVE, saying so; past it, a FAIL says which
    bound it used and why."""
    reasons: list[str] = []
    failed = [o for o in outputs if not o.ok]
    bad_layers = [c for c in layers if c.status in ("fail", "nonfinite")]
    if unmeasured and (failed or bad_layers):
        worst = max([o.error for o in failed] + [c.error for c in bad_layers])
        nonfinite_seen = any(o.status == "nonfinite" for o in failed) or any(
            c.status == "nonfinite" for c in bad_layers)
        if not (nonfinite_seen or problems or tensor_problems) and worst <= ROUNDING_REACH:
            return INCONCLUSIVE, [
                f"error {fmt(worst)} is above tol {tol:g}, but the float32 noise that sets "
                f"each bound was not measured ({unmeasured}): float32 rounding alone reaches "
                f"{ROUNDING_REACH:g} on deep networks, so this cannot tell right from wrong "
                "— make the PyTorch model run in float64, or verify with --dtype float64"]
        problems = [f"bound: tol {tol:g} alone (the float32 noise was not measured: "
                    f"{unmeasured})", *problems]
    if problems or failed or bad_layers or tensor_problems:
        reasons += problems
        reasons += [o.problem for o in failed if o.problem]
        if bad_layers:
            reasons.append(f"first divergence at {first or bad_layers[0].name} "
                           f"({len(bad_layers)} of {len(layers)} compared layers above "
                           "their bound)")
        reasons += tensor_problems
        return FAIL, reasons
    if not outputs:
        return INCONCLUSIVE, ["no output paired: nothing to compare (the networks' outputs "
                              "differ in names, number or shapes)"]
    for o in outputs:
        if o.status == "insensitive":
            reasons.append(
                f"output {o.name} barely depends on the input: it changes by "
                f"{fmt(o.sensitivity)} between two different inputs, below {SENSITIVITY:g}× "
                f"its bound {fmt(o.bound)}, so agreement cannot tell right weights from "
                "wrong ones — estimate BatchNorm statistics on a few batches of real data, "
                "feed real samples with --input, or check for a zero-initialised head")
        elif o.max_abs == 0.0 and o.cosine is None:
            reasons.append(f"output {o.name} is all zeros on both sides")
        elif o.status == "overflow":
            count = max(o.torch_nan_count + o.torch_inf_count, 1)
            reasons.append(
                f"output {o.name} is not finite at the same {count} position(s) on both "
                f"sides ({o.torch_inf_count} Inf, {o.torch_nan_count} NaN): the network "
                f"overflows on this input, in PyTorch and MindSpore alike, and its finite "
                f"values agree (error {fmt(o.error)}, bound {fmt(o.bound)}); what it computes "
                "there cannot be compared — feed real samples (--input, images for a "
                "detector) on which it stays finite")
    if reasons:
        return INCONCLUSIVE, reasons
    return PASS, reasons


def pass_message(outputs: list[OutputComparison], layers: list[LayerComparison],
                 tol: float, drift_at: str | None = None, peak: float = 1.0) -> str:
    """``PASS: 1 output and 161 layers within their bounds; output error 2.0e-05 is
    1.3× its float32 noise (bound 6.4e-05; tol 1e-05 is below what float32 resolves here)``.
    Where rounding compounded (drift > 1) the bound says so, and where it peaked."""
    worst = max(outputs, key=lambda o: o.error / o.bound if o.bound else o.error)
    carried = sum(c.status == "amplified" for c in layers)
    within = len(layers) - carried
    text = (f"PASS: {len(outputs)} output{'s' * (len(outputs) != 1)} and {within} "
            f"layer{'s' * (within != 1)} within their bounds"
            + (f", {carried} more within {'its bound' if carried == 1 else 'theirs'} "
               f"given MindSpore's values before {'it' if carried == 1 else 'them'}"
               if carried else "")
            + f"; output error {fmt(worst.error)}")
    if worst.noise:
        text += f" is {worst.error / worst.noise:.1f}× its float32 noise {fmt(worst.noise)}"
        if worst.bound > tol and worst.drift > 1.0:
            text += (f" (bound {K:g}× noise × drift {worst.drift:.1f} = {fmt(worst.bound)}: "
                     f"MindSpore's rounding compounds through the depth, reaching "
                     f"{max(peak, worst.drift):.1f}× PyTorch's float32 noise"
                     f"{f' at {drift_at}' if drift_at else ''}, each step within "
                     f"{RISE:g}× the level before it; tol {tol:g} is below what float32 "
                     "resolves here)")
        elif worst.bound > tol:
            text += (f" (bound {K:g}× noise = {fmt(worst.bound)}; tol {tol:g} is below what "
                     "float32 resolves here)")
        else:
            text += f" (bound: tol {tol:g})"
    else:
        text += f" <= tol {tol:g}"
    return text
