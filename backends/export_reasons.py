"""Why the exporters (ONNX, torch) leave out the ops the grad pass adds: shared by both, which never
import each other."""

BACKWARD_REASON = ("is a backward primitive of the grad pass: export the forward model, whose gradients the "
                   "framework computes (--emit torch trains under autograd)")
DECODE_REASON = ("is an op of irc's decode graphs (attention over an explicit KV cache): export the model itself; "
                 "serving engines (ONNX Runtime GenAI, vLLM) keep their own cache")
FOLDED_BN_REASON = ("is a CPU-pipeline fusion (fold-bn: a convolution with its BatchNorm folded in): export the "
                    "graph before it")
DROPOUT_MASK_REASON = ("is a training step's random dropout mask (irc.ops.grad_train): export the inference model, "
                       "where dropout is the identity (a framework applies its own in training)")
TRAINING_MODE_REASON = ("with train=true runs in training mode (BatchNorm: the batch's own statistics; a stacked "
                        "recurrent layer: dropout between its layers), a training step's forward (irc.ops.grad_train): "
                        "export or compile the inference graph (leave train= out), and train with irc train")


def training_mode(node) -> bool:
    """A node in training mode (BatchNorm with batch statistics, a recurrent layer's dropout): only the numpy
    reference and the CPU backend's training step run it."""
    return node.attrs.get("train") is True


LOSS_REASON = ("is a training loss: export the model that produces the logits and compute the loss in the "
               "framework (torch: F.cross_entropy, F.mse_loss)")
