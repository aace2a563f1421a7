"""Why the exporters (ONNX, torch) leave out the ops the grad pass adds: shared by both, which never
import each other."""

BACKWARD_REASON = ("is a backward primitive of the grad pass: export the forward model, whose gradients the "
                   "framework computes (--emit torch trains under autograd)")
DECODE_REASON = ("is an op of irc's decode graphs (attention over an explicit KV cache): export the model itself; "
                 "serving engines (ONNX Runtime GenAI, vLLM) keep their own cache")
LOSS_REASON = ("is a training loss: export the model that produces the logits and compute the loss in the "
               "framework (torch: F.cross_entropy, F.mse_loss)")
