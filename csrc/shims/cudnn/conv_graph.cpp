#include "conv_graph.hpp"

#include <cfloat>
#include <string>

namespace fdnn_cudnn {
namespace {

using fdnn_shim::fail;

// Whether a status from building the graph means "cuDNN cannot do this" rather than a fault:
// arguments that passed check_conv_problem are valid, so cuDNN's NOT_SUPPORTED family and
// its plain parameter refusals (a graph it does not take: cudnn_graph.h says the conv op
// assumes each group packed, else BAD_PARAM, and the graph finalize is NOT_SUPPORTED for an
// unsupported combination) are this vendor's limits, which the caller may pass on.
bool is_refusal(cudnnStatus_t status) {
  int code = static_cast<int>(status);
  return (code >= 3000 && code < 4000) || status == CUDNN_STATUS_BAD_PARAM ||
         status == CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND ||
         status == CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
}

// Finalizes a part of the graph: UNSUPPORTED with cuDNN's text when cuDNN refuses it (the
// plan then tries the staged problem, or the caller another shim), VENDOR for a fault.
void finalize_part(Desc* d, const char* what) {
  cudnnStatus_t status = d->try_finalize();
  if (status == CUDNN_STATUS_SUCCESS) return;
  if (is_refusal(status))
    fail(FDNN_ERROR_UNSUPPORTED, "cudnn: cuDNN refuses the %s of this convolution: %s", what,
         cudnn_status_text(status).c_str());
  fail_cudnn(status, (std::string("cudnnBackendFinalize(") + what + ")").c_str());
}

DescPtr make_tensor(int64_t uid, const Geometry& g, const ConvProblem& p) {
  DescPtr t = make_desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t->set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, p.dtype);
  t->set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, g.dims);
  t->set_int64s(CUDNN_ATTR_TENSOR_STRIDES, g.strides);
  t->set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t->set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, g.alignment);
  finalize_part(t.get(), "tensor");
  return t;
}

// An intermediate of a fused graph: never in memory, in the accumulation type.
DescPtr make_virtual(int64_t uid, const Geometry& g, const ConvProblem& p) {
  DescPtr t = make_desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  bool is_virtual = true;
  t->set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, p.compute);
  t->set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, g.dims);
  t->set_int64s(CUDNN_ATTR_TENSOR_STRIDES, g.strides);
  t->set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t->set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, g.alignment);
  t->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  finalize_part(t.get(), "virtual tensor");
  return t;
}

DescPtr make_conv_desc(const ConvProblem& p) {
  DescPtr c = make_desc(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // torch semantics
  c->set_dtype(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, p.compute);
  c->set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  c->set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, static_cast<int64_t>(p.stride.size()));
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, p.stride);
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, p.dilation);
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, p.pad_lo);
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, p.pad_hi);
  finalize_part(c.get(), "convolution");
  return c;
}

// The attribute names of each op's operands, in x, w, y, conv, alpha, beta order.
struct OpAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

OpAttributes op_attributes(int32_t op) {
  switch (op) {
    case FDNN_CONV_FORWARD:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case FDNN_CONV_BACKWARD_DATA:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case FDNN_CONV_BACKWARD_WEIGHT:
      break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

DescPtr make_conv_op(const ConvProblem& p, const Desc& x, const Desc& w, const Desc& y,
                     const Desc& conv, ConvScales scales) {
  OpAttributes names = op_attributes(p.op);
  DescPtr op = make_desc(names.type);
  op->set_desc(names.x, x);
  op->set_desc(names.w, w);
  op->set_desc(names.y, y);
  op->set_desc(names.conv, conv);
  op->set_scale(names.alpha, scales.alpha, p.is_double());
  op->set_scale(names.beta, scales.beta, p.is_double());
  finalize_part(op.get(), "convolution operation");
  return op;
}

DescPtr make_graph(const std::vector<DescPtr>& ops, cudnnHandle_t handle) {
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const DescPtr& op : ops) raw.push_back(op->get());
  DescPtr graph = make_desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<int64_t>(raw.size()), raw.data());
  graph->set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  finalize_part(graph.get(), "operation graph");
  return graph;
}

// cuDNN's pointwise mode for an FDNN activation, with its parameters set on `pw`.
void set_activation(Desc* pw, const ConvProblem& p) {
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_RELU_FWD;
  // DOUBLE, as cudnn-frontend sets them (cuDNN takes DOUBLE or FLOAT for these).
  double lower = 0.0, upper = 0.0, slope = 0.0;
  bool clips = false;
  switch (p.activation) {
    case FDNN_ACTIVATION_RELU: break;
    case FDNN_ACTIVATION_LEAKY_RELU: slope = p.activation_alpha; break;
    case FDNN_ACTIVATION_CLIP:
      lower = p.activation_alpha;
      upper = p.activation_beta;
      clips = true;
      break;
    case FDNN_ACTIVATION_SIGMOID: mode = CUDNN_POINTWISE_SIGMOID_FWD; break;
    case FDNN_ACTIVATION_TANH: mode = CUDNN_POINTWISE_TANH_FWD; break;
    case FDNN_ACTIVATION_GELU_TANH: mode = CUDNN_POINTWISE_GELU_APPROX_TANH_FWD; break;
    case FDNN_ACTIVATION_GELU_ERF: mode = CUDNN_POINTWISE_GELU_FWD; break;
    case FDNN_ACTIVATION_SILU: mode = CUDNN_POINTWISE_SWISH_FWD; break;  // beta 1
    default: break;
  }
  pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  if (mode != CUDNN_POINTWISE_RELU_FWD) return;
  // cudnn_graph.h: NAN_PROPAGATION is required for comparison-based modes such as ReLU,
  // and only CUDNN_PROPAGATE_NAN is supported (the default is NOT_PROPAGATE): set it, as
  // cudnn-frontend does for every ReLU (node/pointwise.h), so NaN stays NaN as in torch.
  cudnnNanPropagation_t nan = CUDNN_PROPAGATE_NAN;
  pw->set(CUDNN_ATTR_POINTWISE_NAN_PROPAGATION, CUDNN_TYPE_NAN_PROPOGATION, 1, &nan);
  // Without a clip the upper bound is the largest float (the frontend's min(clip, FLT_MAX)
  // under FLOAT math), never the attribute's default.
  if (!clips) upper = static_cast<double>(FLT_MAX);
  // value < lower: lower + slope * (value - lower); value > upper: upper
  pw->set(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, 1, &lower);
  pw->set(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, CUDNN_TYPE_DOUBLE, 1, &slope);
  pw->set(CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &upper);
}

// out = pointwise(in[, b]); the pointwise descriptor and the op go into `parts`.
DescPtr make_pointwise_op(const ConvProblem& p, bool is_bias_add, const Desc& in,
                          const Desc* b, const Desc& out, std::vector<DescPtr>* parts) {
  DescPtr pw = make_desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  if (is_bias_add) {
    cudnnPointwiseMode_t add = CUDNN_POINTWISE_ADD;
    pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &add);
  } else {
    set_activation(pw.get(), p);
  }
  pw->set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, p.compute);
  finalize_part(pw.get(), "pointwise");
  DescPtr op = make_desc(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw);
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, in);
  if (b != nullptr) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, out);
  finalize_part(op.get(), "pointwise operation");
  parts->push_back(pw);
  return op;
}

}  // namespace

bool can_fuse_epilogue(const ConvProblem& p) {
  // A repeated bias (stride 0) has no cuDNN tensor: cuDNN takes positive strides only.
  bool bias_in_graph = !p.has_bias || p.bias_stride > 0;
  return p.has_epilogue() && bias_in_graph && p.alpha == 1.0 && p.beta == 0.0 &&
         !p.is_double();
}

ConvGraph build_fused_graph(const ConvProblem& p, cudnnHandle_t handle) {
  ConvGraph g;
  g.fused = true;
  g.binds_bias = p.has_bias;
  bool act = p.activation != FDNN_ACTIVATION_NONE;
  DescPtr x = make_tensor(kUidX, p.x.cudnn, p);
  DescPtr w = make_tensor(kUidW, p.w.cudnn, p);
  DescPtr y = make_tensor(kUidY, p.y.cudnn, p);
  DescPtr conv = make_conv_desc(p);
  DescPtr conv_out = make_virtual(kUidVirtual, p.y.cudnn, p);
  g.parts = {x, w, y, conv, conv_out};
  std::vector<DescPtr> ops{make_conv_op(p, *x, *w, *conv_out, *conv, ConvScales{})};
  DescPtr current = conv_out;
  if (p.has_bias) {
    DescPtr bias = make_tensor(kUidBias, p.bias, p);
    DescPtr biased = act ? make_virtual(kUidVirtual + 1, p.y.cudnn, p) : y;
    ops.push_back(make_pointwise_op(p, true, *current, bias.get(), *biased, &g.parts));
    g.parts.insert(g.parts.end(), {bias, biased});
    current = biased;
  }
  if (act) ops.push_back(make_pointwise_op(p, false, *current, nullptr, *y, &g.parts));
  g.parts.insert(g.parts.end(), ops.begin(), ops.end());
  g.graph = make_graph(ops, handle);
  return g;
}

ConvGraph build_conv_graph(const ConvProblem& p, ConvScales scales, cudnnHandle_t handle) {
  ConvGraph g;
  DescPtr x = make_tensor(kUidX, p.x.cudnn, p);
  DescPtr w = make_tensor(kUidW, p.w.cudnn, p);
  DescPtr y = make_tensor(kUidY, p.y.cudnn, p);
  DescPtr conv = make_conv_desc(p);
  DescPtr op = make_conv_op(p, *x, *w, *y, *conv, scales);
  g.graph = make_graph({op}, handle);
  g.parts = {x, w, y, conv, op};
  return g;
}

}  // namespace fdnn_cudnn
