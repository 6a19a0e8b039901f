// FOR THE LINUX SYNTAX CHECK ONLY (.ci/mps.sh), never used in a real build: the
// MetalPerformanceShadersGraph interfaces the MPS shim uses (MPSGraph.h, MPSGraphTensor.h,
// MPSGraphTensorData.h, MPSGraphExecutable.h, MPSGraphConvolutionOps.h, ...), with the
// signatures, enum values and availability Apple documents. Only what the shim calls.
#pragma once

#import <MetalPerformanceShaders/MetalPerformanceShaders.h>

typedef enum : NSUInteger {
  MPSGraphTensorNamedDataLayoutNCHW = 0,
  MPSGraphTensorNamedDataLayoutNHWC = 1,
  MPSGraphTensorNamedDataLayoutOIHW = 2,
  MPSGraphTensorNamedDataLayoutHWIO = 3,
  MPSGraphTensorNamedDataLayoutCHW = 4,
  MPSGraphTensorNamedDataLayoutHWC = 5,
  MPSGraphTensorNamedDataLayoutHW = 6,
  MPSGraphTensorNamedDataLayoutNCDHW API_AVAILABLE(macos(13.2)) = 7,
  MPSGraphTensorNamedDataLayoutNDHWC API_AVAILABLE(macos(13.2)) = 8,
  MPSGraphTensorNamedDataLayoutOIDHW API_AVAILABLE(macos(13.2)) = 9,
  MPSGraphTensorNamedDataLayoutDHWIO API_AVAILABLE(macos(13.2)) = 10,
} MPSGraphTensorNamedDataLayout;

typedef enum : NSUInteger {
  MPSGraphPaddingStyleExplicit = 0,
  MPSGraphPaddingStyleTF_VALID = 1,
  MPSGraphPaddingStyleTF_SAME = 2,
  MPSGraphPaddingStyleExplicitOffset = 3,
  MPSGraphPaddingStyleONNX_SAME_LOWER API_AVAILABLE(macos(14.0)) = 4,
} MPSGraphPaddingStyle;

typedef enum : NSInteger {
  MPSGraphScatterModeAdd = 0,
  MPSGraphScatterModeSub = 1,
  MPSGraphScatterModeMul = 2,
  MPSGraphScatterModeDiv = 3,
  MPSGraphScatterModeMin = 4,
  MPSGraphScatterModeMax = 5,
  MPSGraphScatterModeSet = 6,
} MPSGraphScatterMode;

@class MPSGraphOperation;

@interface MPSGraphObject : NSObject
@end

@interface MPSGraphType : MPSGraphObject <NSCopying>
@end

@interface MPSGraphShapedType : MPSGraphType
- (instancetype)initWithShape:(MPSShape*)shape dataType:(MPSDataType)dataType;
@property(readwrite, copy) MPSShape* shape;
@property(readwrite, assign) MPSDataType dataType;
@end

@interface MPSGraphTensor : MPSGraphObject <NSCopying>
@property(readonly, copy) MPSShape* shape;
@property(readonly) MPSDataType dataType;
@property(readonly) MPSGraphOperation* operation;
@end

@interface MPSGraphOperation : MPSGraphObject <NSCopying>
@end

@interface MPSGraphTensorData : MPSGraphObject
- (instancetype)initWithMTLBuffer:(id<MTLBuffer>)buffer shape:(MPSShape*)shape dataType:(MPSDataType)dataType;
- (instancetype)initWithMPSNDArray:(MPSNDArray*)ndarray;
@end

@interface MPSGraphDevice : MPSGraphObject
+ (instancetype)deviceWithMTLDevice:(id<MTLDevice>)metalDevice;
@end

@interface MPSGraphCompilationDescriptor : MPSGraphObject <NSCopying>
@end

@interface MPSGraphExecutableExecutionDescriptor : MPSGraphObject
@property(readwrite, atomic) BOOL waitUntilCompleted;
@end

typedef NSDictionary<MPSGraphTensor*, MPSGraphShapedType*> MPSGraphTensorShapedTypeDictionary;

@interface MPSGraphExecutable : MPSGraphObject
@property(readonly, atomic) NSArray<MPSGraphTensor*>* feedTensors;
@property(readonly, atomic) NSArray<MPSGraphTensor*>* targetTensors;
- (NSArray<MPSGraphTensorData*>*)encodeToCommandBuffer:(MPSCommandBuffer*)commandBuffer
                                           inputsArray:(NSArray<MPSGraphTensorData*>*)inputsArray
                                          resultsArray:(NSArray<MPSGraphTensorData*>*)resultsArray
                                   executionDescriptor:(MPSGraphExecutableExecutionDescriptor*)executionDescriptor;
@end

@interface MPSGraphConvolution2DOpDescriptor : MPSGraphObject <NSCopying>
@property(readwrite, nonatomic) NSUInteger strideInX;
@property(readwrite, nonatomic) NSUInteger strideInY;
@property(readwrite, nonatomic) NSUInteger dilationRateInX;
@property(readwrite, nonatomic) NSUInteger dilationRateInY;
@property(readwrite, nonatomic) NSUInteger paddingLeft;
@property(readwrite, nonatomic) NSUInteger paddingRight;
@property(readwrite, nonatomic) NSUInteger paddingTop;
@property(readwrite, nonatomic) NSUInteger paddingBottom;
@property(readwrite, nonatomic) MPSGraphPaddingStyle paddingStyle;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout dataLayout;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout weightsLayout;
@property(readwrite, nonatomic) NSUInteger groups;
@end

API_AVAILABLE(macos(13.2))
@interface MPSGraphConvolution3DOpDescriptor : MPSGraphObject <NSCopying>
@property(readwrite, nonatomic) NSUInteger strideInX;
@property(readwrite, nonatomic) NSUInteger strideInY;
@property(readwrite, nonatomic) NSUInteger strideInZ;
@property(readwrite, nonatomic) NSUInteger dilationRateInX;
@property(readwrite, nonatomic) NSUInteger dilationRateInY;
@property(readwrite, nonatomic) NSUInteger dilationRateInZ;
@property(readwrite, nonatomic) NSUInteger paddingLeft;
@property(readwrite, nonatomic) NSUInteger paddingRight;
@property(readwrite, nonatomic) NSUInteger paddingTop;
@property(readwrite, nonatomic) NSUInteger paddingBottom;
@property(readwrite, nonatomic) NSUInteger paddingFront;
@property(readwrite, nonatomic) NSUInteger paddingBack;
@property(readwrite, nonatomic) MPSGraphPaddingStyle paddingStyle;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout dataLayout;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout weightsLayout;
@property(readwrite, nonatomic) NSUInteger groups;
@end

@interface MPSGraph : MPSGraphObject
+ (instancetype)new;

// MPSGraph.h
- (MPSGraphExecutable*)compileWithDevice:(MPSGraphDevice*)device
                                   feeds:(MPSGraphTensorShapedTypeDictionary*)feeds
                           targetTensors:(NSArray<MPSGraphTensor*>*)targetTensors
                        targetOperations:(NSArray<MPSGraphOperation*>*)targetOperations
                   compilationDescriptor:(MPSGraphCompilationDescriptor*)compilationDescriptor;

// MPSGraphMemoryOps.h
- (MPSGraphTensor*)placeholderWithShape:(MPSShape*)shape dataType:(MPSDataType)dataType name:(NSString*)name;
- (MPSGraphTensor*)constantWithData:(NSData*)data shape:(MPSShape*)shape dataType:(MPSDataType)dataType;
- (MPSGraphTensor*)constantWithScalar:(double)scalar dataType:(MPSDataType)dataType;

// MPSGraphTensorShapeOps.h
- (MPSGraphTensor*)reshapeTensor:(MPSGraphTensor*)tensor withShape:(MPSShape*)shape name:(NSString*)name;
- (MPSGraphTensor*)transposeTensor:(MPSGraphTensor*)tensor
                       permutation:(NSArray<NSNumber*>*)permutation
                              name:(NSString*)name API_AVAILABLE(macos(13.0));
- (MPSGraphTensor*)castTensor:(MPSGraphTensor*)tensor toType:(MPSDataType)type name:(NSString*)name;

// MPSGraphGatherOps.h, MPSGraphScatterOps.h
- (MPSGraphTensor*)gatherWithUpdatesTensor:(MPSGraphTensor*)updatesTensor
                             indicesTensor:(MPSGraphTensor*)indicesTensor
                                      axis:(NSUInteger)axis
                           batchDimensions:(NSUInteger)batchDimensions
                                      name:(NSString*)name;
- (MPSGraphTensor*)scatterWithDataTensor:(MPSGraphTensor*)dataTensor
                           updatesTensor:(MPSGraphTensor*)updatesTensor
                           indicesTensor:(MPSGraphTensor*)indicesTensor
                                    axis:(NSInteger)axis
                                    mode:(MPSGraphScatterMode)mode
                                    name:(NSString*)name;

// MPSGraphArithmeticOps.h, MPSGraphActivationOps.h, MPSGraphReductionOps.h
- (MPSGraphTensor*)additionWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                             secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                        name:(NSString*)name;
- (MPSGraphTensor*)multiplicationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                   secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                              name:(NSString*)name;
- (MPSGraphTensor*)clampWithTensor:(MPSGraphTensor*)tensor
                    minValueTensor:(MPSGraphTensor*)minValueTensor
                    maxValueTensor:(MPSGraphTensor*)maxValueTensor
                              name:(NSString*)name;
- (MPSGraphTensor*)tanhWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)erfWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)reLUWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)sigmoidWithTensor:(MPSGraphTensor*)tensor name:(NSString*)name;
- (MPSGraphTensor*)leakyReLUWithTensor:(MPSGraphTensor*)tensor alpha:(double)alpha name:(NSString*)name;
- (MPSGraphTensor*)reductionSumWithTensor:(MPSGraphTensor*)tensor
                                     axes:(NSArray<NSNumber*>*)axes
                                     name:(NSString*)name;

// MPSGraphConvolutionOps.h
- (MPSGraphTensor*)convolution2DWithSourceTensor:(MPSGraphTensor*)source
                                   weightsTensor:(MPSGraphTensor*)weights
                                      descriptor:(MPSGraphConvolution2DOpDescriptor*)descriptor
                                            name:(NSString*)name;
- (MPSGraphTensor*)convolution2DDataGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                         weightsTensor:(MPSGraphTensor*)weights
                                                           outputShape:(MPSShape*)outputShape
                                          forwardConvolutionDescriptor:(MPSGraphConvolution2DOpDescriptor*)forwardConvolutionDescriptor
                                                                  name:(NSString*)name;
- (MPSGraphTensor*)convolution2DWeightsGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                             sourceTensor:(MPSGraphTensor*)source
                                                              outputShape:(MPSShape*)outputShape
                                             forwardConvolutionDescriptor:(MPSGraphConvolution2DOpDescriptor*)forwardConvolutionDescriptor
                                                                     name:(NSString*)name;
- (MPSGraphTensor*)convolution3DWithSourceTensor:(MPSGraphTensor*)source
                                   weightsTensor:(MPSGraphTensor*)weights
                                      descriptor:(MPSGraphConvolution3DOpDescriptor*)descriptor
                                            name:(NSString*)name API_AVAILABLE(macos(13.2));
- (MPSGraphTensor*)convolution3DDataGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                         weightsTensor:(MPSGraphTensor*)weights
                                                           outputShape:(MPSShape*)outputShape
                                          forwardConvolutionDescriptor:(MPSGraphConvolution3DOpDescriptor*)forwardConvolutionDescriptor
                                                                  name:(NSString*)name API_AVAILABLE(macos(13.2));
- (MPSGraphTensor*)convolution3DWeightsGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                             sourceTensor:(MPSGraphTensor*)source
                                                              outputShape:(MPSShape*)outputShape
                                             forwardConvolutionDescriptor:(MPSGraphConvolution3DOpDescriptor*)forwardConvolutionDescriptor
                                                                     name:(NSString*)name API_AVAILABLE(macos(13.2));
@end
