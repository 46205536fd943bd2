"""NumPy reference of the OD-SGD rules in docs/spec.md, section 4, written from the formulas alone.

Every array is float32 and the arithmetic follows the formula's order, so the package's
NDArray path and fused operator can be compared with it to float32 rounding.
"""
import numpy as np

F32 = np.float32


def rescale_and_clip(grad, rescale_grad, clip_gradient=None):
    """g = r * grad, clipped to [-clip, clip] when clip_gradient is set (> 0)."""
    g = (F32(rescale_grad) * grad).astype(F32)
    if clip_gradient is not None and clip_gradient > 0:
        g = np.clip(g, -F32(clip_gradient), F32(clip_gradient))
    return g


def compensation_scale(g, state_v, mode, beta, eps):
    """c of docs/spec.md, section 4; updates v in place first for the adaptive mode."""
    if mode == "constant":
        return F32(1.0)
    state_v *= F32(beta)
    state_v += F32(1.0 - beta) * g * g
    return (F32(1.0) / np.sqrt(state_v + F32(eps))).astype(F32)


def local_sgd_step(w, W, grad, m, v, *, rescale_grad, lr, momentum, wd, lam,
                   mode="constant", beta=0.95, eps=1e-7, clip_gradient=None):
    """One OD-phase local SGD step: returns w_{t+1}; updates m and v in place."""
    g = rescale_and_clip(grad, rescale_grad, clip_gradient)
    c = compensation_scale(g, v, mode, beta, eps)
    step = g + F32(wd) * W + F32(lam) * c * g * g * (W - w)
    m *= F32(momentum)
    m -= F32(lr) * step
    return (W + m).astype(F32)


def predict_step(w, W, W_prev, grad, v, *, rescale_grad, lr, momentum, wd, lam, num_workers,
                 mode="constant", beta=0.95, eps=1e-7, clip_gradient=None, own_scale=None,
                 prev_scale=None, est=None, prev_decay=0.0):
    """One OD-phase 'predict' step: W_t + mu (W_t - W_{t-1}) - lr (G_hat + wd W_t), with the
    estimate G_hat = own_scale gc of the round's gradient sum (own_scale None: num_workers).

    prev_scale (a number, with est and prev_decay): lr G_hat also takes prev_scale times
    lr_{t-1} G_{t-1}, the servers' previous round recovered from their momentum: after round
    t-1 it is W_t - W_{t-1}, before it est (the last weight change), so
    mom_t = mu mom_{t-1} - lr_{t-1} (G_{t-1} + wd_{t-1} W_{t-1}) gives
    lr_{t-1} G_{t-1} = mu est - (W_t - W_{t-1}) - prev_decay W_{t-1}; est becomes W_t - W_{t-1}."""
    g = rescale_and_clip(grad, rescale_grad, clip_gradient)
    c = compensation_scale(g, v, mode, beta, eps)
    gc = g + F32(lam) * c * g * g * (W - w)
    own = F32(num_workers if own_scale is None else own_scale)
    new_w = W + F32(momentum) * (W - W_prev) - F32(lr) * (own * gc + F32(wd) * W)
    if prev_scale is not None:
        dW = W - W_prev
        previous_sum = F32(momentum) * est - dW - F32(prev_decay) * W_prev
        est[...] = dW
        new_w = new_w - F32(prev_scale) * previous_sum
    return new_w.astype(F32)


def global_sgd_step(W, grad_sum, mom, *, rescale_grad, lr, momentum, wd, clip_gradient=None):
    """MXNet's sgd(_mom)_update as the servers apply it to the sum of the workers' gradients."""
    g = rescale_and_clip(grad_sum, rescale_grad, clip_gradient)
    mom *= F32(momentum)
    mom -= F32(lr) * (g + F32(wd) * W)
    return (W + mom).astype(F32)



def global_nag_step(W, grad_sum, mom, *, rescale_grad, lr, momentum, wd, clip_gradient=None):
    """MXNet 1.9.1's NAG on the servers, applied to the sum of the workers' gradients:
    nag_mom_update in place (out = weight), whose kernel keeps the state scaled by the rate and
    reads the weight for the state's weight decay after writing it:
    a = mu mom;  W' = (W - a) + (mu + 1) (a - lr (G + wd W));  mom = a - lr (G + wd W').
    With momentum 0 mx.optimizer.NAG keeps no state and applies sgd_update."""
    g = rescale_and_clip(grad_sum, rescale_grad, clip_gradient)
    if momentum == 0:
        return (W - F32(lr) * (g + F32(wd) * W)).astype(F32)
    a = F32(momentum) * mom
    new_W = ((W - a) + (F32(momentum) + F32(1)) * (a - F32(lr) * (g + F32(wd) * W))).astype(F32)
    mom[...] = a - F32(lr) * (g + F32(wd) * new_W)
    return new_W


def nag_predict_step(w, W, W_prev, grad, est, v, *, rescale_grad, lr, momentum, wd,
                     prev_decay, lam, num_workers, mode="constant", beta=0.95, eps=1e-7,
                     clip_gradient=None, own_scale=None, prev_scale=None):
    """One OD-phase 'predict' step for the global optimizer NAG (docs/predict.md). The
    estimate est of the servers' state (global_nag_step's mom) is advanced in place from
    dW = W_t - W_{t-1} and prev_decay = lr x wd of the round that produced W_t, which inverts
    that round: est = (dW + mu est) / (1 + mu) - prev_decay dW. Then NAG's weight update with
    the gradient sum G_hat = own_scale gc (own_scale None: num_workers) is applied to W_t.

    prev_scale (a number): lr G_hat also takes prev_scale times lr_{t-1} G_{t-1}, which the
    state rule mom_t = mu mom_{t-1} - lr_{t-1} G_{t-1} - prev_decay W_t gives from est before
    and after its update."""
    g = rescale_and_clip(grad, rescale_grad, clip_gradient)
    c = compensation_scale(g, v, mode, beta, eps)
    gc = g + F32(lam) * c * g * g * (W - w)
    one_plus_mu = F32(momentum) + F32(1)
    dW = W - W_prev
    est_before = est.copy()
    est[...] = (dW + F32(momentum) * est) / one_plus_mu - F32(prev_decay) * dW
    a = F32(momentum) * est
    own = F32(num_workers if own_scale is None else own_scale)
    d = own * gc + F32(wd) * W
    bracket = a - F32(lr) * d
    if prev_scale is not None:
        previous_sum = F32(momentum) * est_before - est - F32(prev_decay) * W
        bracket = bracket - F32(prev_scale) * previous_sum
    return ((W - a) + one_plus_mu * bracket).astype(F32)


# -- 'predict' for the adaptive optimizers (docs/predict.md, "Any other global optimizer") ----
# The servers' step of each family as MXNet 1.9.1 documents its operator, and the worker's
# prediction: the same step on W_t with G_hat = N g, its state the worker's own estimate.

def global_adam_step(W, grad_sum, state, *, t, rescale_grad, lr, wd, beta1=0.9, beta2=0.999,
                     epsilon=1e-8, clip_gradient=None):
    """mx.optimizer.Adam at update count t: g = clip(r G + wd W); m, v moved towards g, g^2;
    W - lr sqrt(1 - beta2^t) / (1 - beta1^t) m / (sqrt(v) + eps). state = [m, v], in place."""
    g = (F32(rescale_grad) * grad_sum + F32(wd) * W).astype(F32)
    if clip_gradient is not None and clip_gradient > 0:
        g = np.clip(g, -F32(clip_gradient), F32(clip_gradient))
    m, v = state
    m[:] = F32(beta1) * m + F32(1 - beta1) * g
    v[:] = F32(beta2) * v + F32(1 - beta2) * g * g
    rate = F32(lr * np.sqrt(1. - beta2 ** t) / (1. - beta1 ** t))
    return (W - rate * m / (np.sqrt(v) + F32(epsilon))).astype(F32)


def global_rmsprop_step(W, grad_sum, state, *, rescale_grad, lr, wd, gamma1=0.9,
                        epsilon=1e-8, clip_gradient=None):
    """mx.optimizer.RMSProp (not centered): g = clip(r G + wd W); n = (1 - gamma1) g^2 +
    gamma1 n; W - lr g / sqrt(n + eps). state = [n], in place."""
    g = (F32(rescale_grad) * grad_sum + F32(wd) * W).astype(F32)
    if clip_gradient is not None and clip_gradient > 0:
        g = np.clip(g, -F32(clip_gradient), F32(clip_gradient))
    n, = state
    n[:] = F32(1 - gamma1) * g * g + F32(gamma1) * n
    return (W - F32(lr) * g / np.sqrt(n + F32(epsilon))).astype(F32)


def global_adagrad_step(W, grad_sum, state, *, rescale_grad, lr, wd, epsilon=1e-7,
                        clip_gradient=None):
    """mx.optimizer.AdaGrad: g = clip(r G); h += g^2; W - lr (g / sqrt(h + eps) + wd W).
    state = [h], in place."""
    g = rescale_and_clip(grad_sum, rescale_grad, clip_gradient)
    h, = state
    h[:] = h + g * g
    return (W - F32(lr) * (g / np.sqrt(h + F32(epsilon)) + F32(wd) * W)).astype(F32)


#: family name -> (the servers' step, the names of its state arrays)
ADAPTIVE_STEPS = {"adam": (global_adam_step, ("mean", "var")),
                  "rmsprop": (global_rmsprop_step, ("n",)),
                  "adagrad": (global_adagrad_step, ("history",))}


def adaptive_predict_step(family, W, grad, state, *, num_workers, rescale_grad, **rates):
    """The worker's prediction for a global optimizer of `family`: its step on W_t with
    G_hat = N grad (the rescale applied after, as the servers apply it to the sum), advancing
    the worker's estimate `state` of the servers' state in place."""
    step, _ = ADAPTIVE_STEPS[family]
    return step(W, F32(num_workers) * grad, state, rescale_grad=rescale_grad, **rates)


def recover_adam_sum(step, m, v, own, beta1, beta2):
    """Adam's effective gradient of a round from its step s = (W_before - W_after) / lr_c and
    the state before it (docs/predict.md, "Adam: the state recovered from the global steps"):
    the roots of (b^2 - e s^2) G^2 + 2 a b G + a^2 - s^2 c = 0 (a = beta1 m, b = 1 - beta1,
    c = beta2 v, e = 1 - beta2) whose b G + a has the sign of s, the nearest to `own`; `own`
    where b^2 - e s^2 is within 1e-3 b^2 of 0 or no root fits."""
    b, e = F32(1.0 - beta1), F32(1.0 - beta2)
    a, c = F32(beta1) * m, F32(beta2) * v
    A = b * b - e * step * step
    solvable = np.abs(A) > F32(1e-3) * b * b
    safe = np.where(solvable, A, F32(1.0))
    spread = np.abs(step) * np.sqrt(np.maximum(b * b * c + a * a * e - step * step * e * c, 0))
    best, distance = own.copy(), np.full(own.shape, np.inf, F32)
    for root in ((spread - a * b) / safe, (-spread - a * b) / safe):
        fits = solvable & ((np.sign(a + b * root) == np.sign(step)) | (step == 0))
        closer = fits & (np.abs(root - own) < distance)
        best = np.where(closer, root, best)
        distance = np.where(closer, np.abs(root - own), distance)
    return best.astype(F32)


def adam_predict_step(W, W_prev, grad, state, own, *, num_workers, rescale_grad, lr, wd, t,
                      previous_lr=None, beta1=0.9, beta2=0.999, epsilon=1e-8,
                      clip_gradient=None):
    """The worker's prediction for a global Adam at update count t: state = [m, v] before round
    t - 1 and own = [the worker's own estimate of round t - 1's gradient], both advanced in
    place. previous_lr: the rate of round t - 1 (multiplier included) where it was the
    worker's previous step (None: not known, the state is not advanced)."""
    m, v = state

    def rate(lr_, count):
        return F32(lr_ * np.sqrt(1. - beta2 ** count) / (1. - beta1 ** count))
    if previous_lr is not None:
        G = own[0]
        if previous_lr > 0:
            G = recover_adam_sum((W_prev - W) / rate(previous_lr, t - 1), m, v, own[0],
                                 beta1, beta2)
        m[:] = F32(beta1) * m + F32(1 - beta1) * G
        v[:] = F32(beta2) * v + F32(1 - beta2) * G * G
    g = (F32(rescale_grad * num_workers) * grad + F32(wd) * W).astype(F32)
    if clip_gradient is not None and clip_gradient > 0:
        g = np.clip(g, -F32(clip_gradient), F32(clip_gradient))
    own[0] = g
    m1 = F32(beta1) * m + F32(1 - beta1) * g
    v1 = F32(beta2) * v + F32(1 - beta2) * g * g
    return (W - rate(lr, t) * m1 / (np.sqrt(v1) + F32(epsilon))).astype(F32)
